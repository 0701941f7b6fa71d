// Compressed pieces chunk by chunk, outside HDF5's filter pipeline, so chunks are compressed and
// decompressed on many threads (HDF5 runs its filters under its global lock, one chunk at a time):
// - ChunkGrid: the chunks of a piece's dataset under piece_chunk_dims (h5_types.h). Those chunks
//   are 1 along the leading dims, whole along the trailing ones and cut along one dim k, so every
//   chunk holds one contiguous run of the piece's elements in storage order; an edge chunk along k
//   holds fewer valid rows, and is stored full size with zeros after them (as HDF5 stores it).
// - encode_chunk / decode_chunk: byte for byte what the HDF5 filter pipeline of the store writes
//   and reads: the shuffle filter (H5Z_FILTER_SHUFFLE: byte j of element i moves to j*n + i) when
//   the codec has it, then one zstd frame with content size and checksum (filter 32015, as
//   formats/store/h5/zstd_filter.cc and hdf5plugin decode it). Chunks go in and out of the file with
//   H5Dwrite_chunk / H5Dread_chunk, and h5py + hdf5plugin read the datasets like any HDF5 file's.
// Pure functions and values; thread safe (one zstd context per thread).
#pragma once

#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "formats/base/status.h"
#include "formats/store/manifest.h"

namespace ckpt::store {

struct ChunkGrid {
  std::vector<hsize_t> dims, chunk;  // dataset dims and chunk dims (piece_chunk_dims)
  size_t k = 0;                      // the cut dim: chunk[d] = 1 before it, dims[d] after it
  uint64_t inner = 1;                // elements of one index of dim k (product of dims after k)
  uint64_t per_run = 1;              // chunks along dim k
  uint64_t num_chunks = 0;

  static ChunkGrid of(const std::vector<hsize_t>& dims, const std::vector<hsize_t>& chunk);
  uint64_t chunk_elems() const { return chunk[k] * inner; }  // elements of a stored chunk
  uint64_t first(uint64_t c) const;                           // its first element (storage order)
  uint64_t valid(uint64_t c) const;                           // its elements inside the dataset
  std::vector<hsize_t> offset(uint64_t c) const;              // its dataset coordinates
  uint64_t chunk_of(uint64_t element) const;                  // the chunk holding an element
};

// A stored chunk's bytes in a buffer that is reused: growing it allocates without zero fill, and a
// chunk that fits its capacity takes no allocation (fresh pages cost more than zstd here).
struct ChunkBuffer {
  std::unique_ptr<char[]> data;
  size_t capacity = 0;
  size_t size = 0;  // bytes of the stored chunk
  void reserve(size_t n);
};

// Filters `bytes` bytes (a whole chunk) of elements of `esize` bytes as the dataset's filter
// pipeline would, into `out` (compressed straight into it). `src_done`, when given, is called once
// `src` is no longer read (after the shuffle when shuffled, else at the end), on every path.
Status encode_chunk_into(Codec codec, int level, size_t esize, const void* src, size_t bytes, ChunkBuffer& out,
                         const std::function<void()>& src_done = nullptr);
// The same, returning the stored chunk as a string (tests).
Result<std::string> encode_chunk(Codec codec, int level, size_t esize, const void* src, size_t bytes);
// True when encode_chunk copies the input (shuffles it) before compressing: `src_done` comes
// early and the caller's buffer can be released while the chunk is still compressing.
inline bool encode_copies_input(Codec codec, size_t esize) { return codec == Codec::kShuffleZstd && esize > 1; }

// The inverse: `stored` (as read with H5Dread_chunk) into exactly `bytes` bytes at dst.
// Errors: ChunkCorrupt (not a zstd frame, checksum, size other than `bytes`).
Status decode_chunk(Codec codec, size_t esize, const void* stored, size_t stored_bytes, void* dst, size_t bytes);

}  // namespace ckpt::store
