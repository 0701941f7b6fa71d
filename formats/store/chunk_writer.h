// Writes compressed pieces of a shard: the elements of each piece arrive in storage order
// (ShardWriter::write), are staged into whole chunks (formats/store/chunk_codec.h ChunkGrid),
// compressed on the writer's thread pool, and written in submission order with H5Dwrite_chunk
// (already-filtered chunks), so the file's bytes do not depend on thread timing. At most
// 2 x pool size + 1 chunks are in flight: memory stays a few chunks whatever the piece size;
// their staging buffers are reused. A whole chunk inside one write() call whose codec shuffles
// (encode_copies_input) is not staged: the pool task shuffles it straight from the caller's
// buffer, and write() returns once every such task has shuffled its chunk (the caller's buffer
// is then free again; the chunks may still be compressing). Chunks are compressed straight into
// reused buffers (ChunkBuffer). The writing thread then only stages partial chunks and calls
// H5Dwrite_chunk.
// Thread safety: one thread calls add/write/flush; compression runs on the pool.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "formats/base/status.h"
#include "formats/base/thread_pool.h"
#include "formats/store/chunk_codec.h"

namespace ckpt::store {

class ChunkWriter {
 public:
  // `max_inflight`: at most this many chunks in flight (>= 1), below the 2 x pool size + 1 that
  // keep the pool busy (a memory budget: StoreOptions::chunk_memory).
  ChunkWriter(ThreadPool* pool, std::string path, size_t max_inflight = SIZE_MAX)
      : pool_(pool), path_(std::move(path)), max_inflight_(max_inflight < 1 ? 1 : max_inflight) {}
  ~ChunkWriter();
  // A chunked dataset to fill (kept open by the caller until flush() after its last write).
  // `desc` and `tensor` name it in errors (an error may surface during a later stream's write).
  size_t add(hid_t ds, const std::vector<hsize_t>& dims, const std::vector<hsize_t>& chunk, size_t esize, Codec codec, int level,
             std::string desc, std::string tensor);
  // The next `count` elements of stream `id`.
  Status write(size_t id, const void* data, uint64_t count);
  // Every chunk staged so far compressed and written; the first error.
  Status flush();

 private:
  struct Stream {
    hid_t ds = -1;
    ChunkGrid grid;
    size_t esize = 1;
    Codec codec = Codec::kNone;
    int level = 1;
    std::string desc, tensor;
    uint64_t pos = 0;              // elements received
    std::vector<char> stage;       // the chunk being filled (chunk_elems * esize bytes)
  };
  struct Pending {
    size_t id;
    uint64_t chunk;
    std::shared_ptr<std::vector<char>> raw;  // the staged chunk (null: taken from the caller); back to `spare_` once compressed
    std::shared_ptr<ChunkBuffer> out;        // the stored chunk; back to `spare_out_` once written
    std::future<Status> stored;
  };
  // Queues chunk `chunk` of stream `id`: its staged buffer, or, with `src`, the caller's bytes
  // (then `read_done` is set once the task no longer reads them).
  Status submit(size_t id, uint64_t chunk, const char* src = nullptr, std::vector<std::future<void>>* read_done = nullptr);
  Status write_front();

  ThreadPool* pool_;
  std::string path_;
  size_t max_inflight_;
  std::vector<Stream> streams_;
  std::deque<Pending> fifo_;
  std::vector<std::vector<char>> spare_;  // staging buffers to reuse (fresh pages cost more than zstd)
  std::vector<std::shared_ptr<ChunkBuffer>> spare_out_;  // stored-chunk buffers to reuse
  Status error_;
};

}  // namespace ckpt::store
