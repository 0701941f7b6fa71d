// Fast kernels of the casts for the hot pairs (bf16/f16 <-> f32): branch-free loops that also
// report whether some element needs the exact scalar path (NaN, Inf or overflow: a result or
// input with an all-ones exponent); cast_elements (formats/dtype/dtype_cast.cc) then redoes that block
// with the scalar path. Each kernel is compiled for the baseline ISA and, on x86, for AVX2
// (+F16C for f16); the variant is picked at run time (set_cast_portable_only forces the
// portable one). Internal to formats/; thread safe.
#pragma once

#include <cstddef>
#include <cstdint>

#include "formats/dtype/dtype.h"

namespace ckpt::cast_detail {

// Kernel(src, dst, n, nt): converts n elements, returns nonzero when some element needs the
// scalar path. nt asks for non-temporal (streaming) stores, used by the ISA kernels when dst is
// 32-byte aligned; the portable kernels ignore it.
using Kernel = uint32_t (*)(const uint8_t*, uint8_t*, size_t, bool);

// The kernel of a pair (for this CPU); nullptr for a pair without one.
Kernel fast_kernel(DType from, DType to);

// Orders streaming stores made by kernels before the caller publishes the output (x86 sfence;
// nothing elsewhere).
void fence_streaming_stores();

}  // namespace ckpt::cast_detail
