// Staged reads: a TensorSource whose read of a box is a plain read of other bytes followed by a
// transform that needs no I/O (the transposed `in-out` weights of the profile views,
// converters/profile/profile_view.h) may also implement StagedReads. The executor's pipeline
// (reshard/chunk_pipeline.h) then does the plain read on its reading thread, into the chunk's raw
// buffer, and the transform on a worker, straight into the chunk's output rows: the transposes of
// one chunk overlap the reads of the next, and no re-layout copy follows them.
// The pipeline finds the interface with a dynamic_cast of its source (it is not part of
// formats/tensor/tensor_io.h's TensorSource); a source that does not implement it is read with read().
#pragma once

#include <cstddef>
#include <cstdint>

#include "formats/base/status.h"
#include "formats/tensor/region.h"

namespace ckpt {

class StagedReads {
 public:
  virtual ~StagedReads() = default;
  // Bytes the staged form of box `sub` of piece `piece` takes; 0 when that read is not staged
  // (the caller uses TensorSource::read). Only 2-D boxes are staged.
  virtual uint64_t staged_bytes(size_t piece, const Box& sub) = 0;
  // Fills `stage` (staged_bytes(piece, sub) bytes) for the read of `sub`: the I/O, on the thread
  // that reads the source.
  virtual Status read_stage(size_t piece, const Box& sub, void* stage) = 0;
  // From a filled stage: the elements of `sub` in the piece's dtype, row r of `sub` at
  // dst + r * ld elements (ld >= sub.extent[1]), as read() would give them densely. No I/O;
  // may run on any thread, several at once.
  virtual Status finish_stage(size_t piece, const Box& sub, const void* stage, void* dst, int64_t ld) = 0;
};

}  // namespace ckpt
