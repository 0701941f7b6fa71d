// Reads compressed datasets of the store chunk by chunk: each stored chunk is found under h5_lock()
// (H5Dget_chunk_info_by_coord: file address and size), read raw outside the lock (pread on the
// file's descriptor; H5Dread_chunk under the lock when HDF5 gives none) and decoded
// (formats/store/chunk_codec.h) outside the lock: on the
// calling thread, or, for a read spanning several chunks of a dataset with a decode pool, one
// chunk per task on the pool and the calling thread together (each places its chunk's part of
// the read; the parts are disjoint). Datasets whose chunking
// is not the store writer's (files written by other tools) are left to HDF5's own path: grid_of()
// says which. A chunk the read covers whole (and that is one run of the destination) is decoded
// straight into the destination; otherwise the last chunk decoded by a thread is kept (one per
// thread), so reads that cut a chunk in two decode it once. Errors are ChunkCorrupt naming the
// chunk (the caller adds file and dataset).
// Thread safety: any thread; HDF5 calls take h5_lock().
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "formats/base/status.h"
#include "formats/base/thread_pool.h"
#include "formats/store/chunk_codec.h"
#include "formats/tensor/region.h"

namespace ckpt::store {

// What a compressed native SRC costs beside a job's chunks on `threads`: chunks are decoded on
// the reading thread and a pool of threads - 1, each keeping its last decoded chunk, its raw read
// buffer (4 MiB chunks) and a zstd context, and the threads' own memory (malloc arenas, stacks)
// grows with them: 2 x threads - 1 shares of 10 MiB (measured on a 3.08 GB store at --threads 1,
// 2, 4: reshard 49-83 MiB, to-hf 51-88 MiB, each under its floor or budget;
// converters/jobs/memory_fit.h). StoreReader::read_memory.
inline constexpr uint64_t kDecodeThreadBytes = uint64_t{10} << 20;

struct ChunkedDataset {
  uint64_t uid = 0;  // unique per process (next_chunked_uid): keys the per-thread decoded chunk
  hid_t ds = -1;
  ChunkGrid grid;
  Codec codec = Codec::kNone;
  size_t esize = 1;
  ThreadPool* decode_pool = nullptr;  // decodes chunks of one read in parallel; null: the calling thread
  int fd = -1;  // the file's descriptor (h5_posix_fd): stored chunks are read with pread outside h5_lock(); -1: H5Dread_chunk
};

uint64_t next_chunked_uid();

// The dataset's grid when it is chunked as piece_chunk_dims would chunk `dims` for some target
// (ones before the cut dim, whole after it) and filtered by exactly the codec's filters.
std::optional<ChunkGrid> chunk_grid_of(hid_t ds, const std::vector<hsize_t>& dims, Codec codec, size_t esize);
// The chunk-shape part of that, for a chunked dataset's creation property list `dcpl` whose
// filters the caller has checked (StoreReader's open-time storage check).
std::optional<ChunkGrid> chunk_grid_of_plist(hid_t dcpl, const std::vector<hsize_t>& dims, size_t esize);

// Box `sub` (dataset coordinates, inside the dataset) into dst, dense row-major.
Status read_chunked_box(const ChunkedDataset& d, const Box& sub, void* dst);
// Elements [begin, end) in storage order into dst.
Status read_chunked_range(const ChunkedDataset& d, uint64_t begin, uint64_t end, void* dst);

}  // namespace ckpt::store
