// Executor: fills the pieces of a TensorSink from whatever pieces of a TensorSource cover them.
// Reads any box of a global tensor by box intersection with the source pieces (SourceIndex,
// reshard/source_index.h), casts dtypes, streams each target piece in storage order in bounded
// chunks (ChunkPipeline, reshard/chunk_pipeline.h); output bytes do not depend on the thread count.
// Thread safety: functions are reentrant; one TensorSource/TensorSink per call.
// With threads > 1 all source reads stay on the calling thread and all sink writes run, in order,
// on one writer thread (so a source and a sink must not share unlocked state); workers only cast
// and copy. A chunk that the source holds as raw file ranges (TensorSource::file_extent) goes
// to a sink that accepts file extents without being read: the sink copies file to file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/base/status.h"
#include "formats/dtype/dtype.h"
#include "formats/tensor/region.h"
#include "formats/tensor/tensor_io.h"
#include "reshard/source_index.h"

namespace ckpt {

// Reads `box` (global coordinates) of global tensor `tensor` into `dst`, dense row-major of
// extent box.extent, converted to `out` (ckpt::cast_elements with `cast`).
Status read_global_box(TensorSource& src, const SourceIndex& index, const std::string& tensor, const Box& box,
                       DType out, void* dst, const CastOptions& cast = {});

struct ExecOptions {
  // Output bytes per chunk (one sink write). Peak buffer memory of execute() is about
  // pipeline_depth(threads) * max_chunk_bytes * (1 + max source/target element size ratio [+1 when a
  // part needs both a cast and a re-layout]); see exec_peak_bytes().
  uint64_t max_chunk_bytes = 64ull << 20;
  // Output bytes per chunk the sink copies as file ranges (TensorSink::accepts_file_extents): such a
  // chunk holds no buffer, so it may be larger than max_chunk_bytes (never smaller): a few sink
  // hand-offs per 64 MiB, not one per small chunk (reshard/chunk_pipeline.h).
  uint64_t max_run_chunk_bytes = 64ull << 20;
  int threads = 1;  // 1: everything inline; N > 1: this thread reads, a writer thread writes, N-1 workers cast/copy
  CastOptions cast;
  // Called on the calling thread after each chunk is written: (output bytes done, total).
  std::function<void(uint64_t, uint64_t)> progress;
  // When non-empty, only these target pieces are filled and written (multi-process execution:
  // every piece is still declared to dst.begin()). Indices into out_pieces, ascending.
  std::vector<size_t> only_pieces;
  // Called by execute() after every piece is written, before dst.commit(): an error aborts the
  // sink (a job's check of its SRC: nothing is committed from a corrupt source).
  std::function<Status()> before_commit;
};

// Number of chunks in flight for a thread count (2 or more when threads > 1).
int exec_pipeline_depth(int threads);
// Upper bound of execute()'s buffer memory for options and the widest source/target element sizes.
uint64_t exec_peak_bytes(const ExecOptions& opts, size_t max_src_elem, size_t min_out_elem);
// The chunk size (ExecOptions::max_chunk_bytes) that keeps execute()'s buffers within `budget`
// bytes for a thread count and the widest source / narrowest target element sizes (at least 64 KiB).
uint64_t exec_chunk_bytes(uint64_t budget, int threads, size_t max_src_elem, size_t min_out_elem);

// Checks before any write that every (selected) target piece is valid for its tensor and fully
// covered by the source; errors name the tensor, piece and missing box.
Status check_plan_coverage(const SourceIndex& index, const std::vector<TensorMeta>& out_tensors,
                           const std::vector<Piece>& out_pieces, const std::vector<size_t>& only_pieces = {});

// dst.begin(out_tensors, out_pieces, metadata); fills every (selected) piece chunk by chunk in
// storage order from `src`; dst.commit(). Coverage is checked before begin(); on any error after
// begin() dst.abort() is called and the error (with tensor/piece context) returned.
Status execute(TensorSource& src, TensorSink& dst, const std::vector<TensorMeta>& out_tensors,
               const std::vector<Piece>& out_pieces, const nlohmann::json& metadata, const ExecOptions& opts = {});

// Same, without begin()/commit()/abort(): fills pieces of a sink the caller already began
// (`out_pieces` as declared to it). For callers that drive the sink themselves (multi-rank
// writers, several sources). Coverage is not checked first: an uncovered chunk fails when reached.
Status execute_into(TensorSource& src, const SourceIndex& index, TensorSink& dst, const std::vector<Piece>& out_pieces,
                    const ExecOptions& opts = {});

}  // namespace ckpt
