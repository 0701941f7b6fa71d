// ChunkPipeline: the executor's streaming loop. Fills target pieces of a sink chunk by chunk in
// storage order: each chunk's copies (copy_ops) are read from the source on the calling thread,
// cast and re-laid out (inline, or on threads-1 workers), and written in chunk order (inline, or
// on one writer thread: write-behind). At most exec_pipeline_depth(threads) chunks are in flight,
// each in its own reused buffers; output bytes do not depend on the thread count.
// A chunk that the source holds as raw file ranges in the target dtype goes to a sink that
// accepts file extents as those ranges, without being read: whole rows split over pieces by rows
// (column-parallel shards) as a few ranges, and, for a sink that gathers, rows split over pieces
// by columns (row-parallel shards) as one range per row and piece.
// Such a chunk holds no buffer, so it spans up to max_run_chunk_bytes whatever the chunk size: the sink's
// hand-offs (a queue entry, a lock, a copy call each) come a few per 64 MiB, not per small chunk.
// Thread safety: one pipeline per call, driven by one thread; source reads stay on it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <future>
#include <memory>
#include <vector>

#include "formats/base/status.h"
#include "formats/base/thread_pool.h"
#include "formats/tensor/tensor_io.h"
#include "formats/tensor/write_placement.h"
#include "reshard/executor.h"
#include "reshard/source_index.h"
#include "reshard/staged_read.h"

namespace ckpt {

class ChunkPipeline {
 public:
  ChunkPipeline(TensorSource& src, const SourceIndex& index, TensorSink& dst, const std::vector<Piece>& out_pieces,
                const ExecOptions& opts);
  ~ChunkPipeline();  // waits for any work still in flight (after an error) before the buffers go

  // Fills target pieces `sel` (indices into out_pieces, in this order), waits for the last write.
  // On the first error: no later chunk is written, every worker and the writer are waited for,
  // and the error (with tensor/piece context) is returned. `total`: output bytes, for progress.
  Status run(const std::vector<size_t>& sel, uint64_t total);

  // Buffers and work of one chunk in flight. Buffers are reused (never shrunk).
  struct Slot {
    std::vector<uint8_t> out, raw, tmp;
    size_t out_at = 0;              // the chunk's first byte in `out` (its file offset's 4 KiB phase, when known)
    CopyOps copies;                 // the chunk's boxes and source parts
    std::vector<bool> direct;       // per copy: read straight into `out` (same dtype, whole box)
    std::vector<bool> staged;       // per copy: a staged read (StagedReads): stage into `raw`, finish into `out`
    std::vector<uint64_t> raw_off;  // per copy: byte offset in `raw` (when not direct)
    uint64_t raw_bytes = 0;         // bytes read into `raw` (0: nothing to cast or re-lay out)
    // The chunk as file ranges written back to back in storage order: the sink copies them file to
    // file (a sink that gathers: in one call, e.g. each row from the column blocks of tp ranks)
    // instead of the chunk being read. Empty: read into `out`.
    std::vector<FileExtent> runs;
    size_t piece = 0;
    int64_t count = 0;
    bool busy = false;         // read; its transform and write may still be pending
    bool async = false;        // `fut` holds its transform
    std::future<Status> fut;   // transform (worker pool)
    std::future<Status> wfut;  // write (writer thread), when there is one
  };

 private:
  Status fill(const std::vector<size_t>& sel);                // every chunk; stops at the first error
  // One chunk: read, transform, write; elements [begin, end), or [begin, end_as_runs) when the
  // sink takes those as file ranges (the slot's count says which).
  Status push(size_t piece, int64_t begin, int64_t end, int64_t end_as_runs);
  Status prepare(Slot& s, size_t piece, int64_t begin, int64_t end, int64_t end_as_runs);
  Status read(Slot& s);
  Status transform_and_write(Slot& s);
  Status write_chunk(Slot& s);  // waits for the transform; writes (on the writer thread if any)
  Status finish(Slot& s);       // waits until the slot's chunk is written, reports progress
  Status drain();               // finishes every slot in chunk order
  void abandon();               // after an error: waits for workers and the writer

  TensorSource& src_;
  const SourceIndex& index_;
  TensorSink& dst_;
  const std::vector<Piece>& out_;
  const ExecOptions& opts_;
  StagedReads* staged_ = nullptr;  // the source's staged reads, when it has them
  const WritePlacement* placement_ = nullptr;  // where the sink's pieces land, when it says
  std::vector<Slot> slots_;     // declared before the threads: outlives them
  std::unique_ptr<ThreadPool> pool_, writer_;
  uint64_t seq_ = 0;            // chunk sequence number
  uint64_t done_ = 0, total_ = 0;
  std::atomic<bool> failed_{false};  // set by the first failed transform or write: later writes are skipped
};

}  // namespace ckpt
