// Reading one source part and casting elements, with the tensor, box and piece in any error:
// the two steps every copy of the engine is made of (read_global_box, the chunk pipeline).
// Thread safety: read_part uses the source (one thread at a time); cast_with_context is pure.
#pragma once

#include <cstddef>
#include <string>

#include "formats/base/status.h"
#include "formats/dtype/dtype.h"
#include "formats/tensor/region.h"
#include "formats/tensor/tensor_io.h"
#include "reshard/source_index.h"

namespace ckpt {

// Reads part `p` (global box inside source piece p.piece) into `dst` in the piece's stored dtype.
Status read_part(TensorSource& src, const SourcePart& p, void* dst);

// cast_elements (a memcpy when from == to); errors name `tensor`, `box` and both dtypes.
Status cast_with_context(const void* in, DType from, void* out, DType to, size_t n, const CastOptions& cast,
                         const std::string& tensor, const Box& box);

}  // namespace ckpt
