// scan_source(): reads every byte of every piece of any TensorSource (safetensors file, HF
// directory, native store) in bounded chunks, so that `ckpt verify` can check a format without
// checksums: structure is validated by opening the source, content by reading all of it.
// Thread safety: uses the source from the calling thread only.
#pragma once

#include <cstdint>
#include <functional>

#include "formats/store/store_reader.h"
#include "formats/tensor/tensor_io.h"

namespace ckpt::store {

// Reads each piece's region box by box in chunks of at most `chunk_bytes` (at least one element).
// A failing read is recorded (piece index + status, with the tensor name) and the scan goes on
// with the next piece. `progress(done_bytes, total_bytes)` is called after each chunk.
VerifyReport scan_source(TensorSource& src, const std::function<void(uint64_t, uint64_t)>& progress = nullptr,
                         uint64_t chunk_bytes = 16ull << 20);

}  // namespace ckpt::store
