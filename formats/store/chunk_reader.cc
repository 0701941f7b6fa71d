#include "formats/store/chunk_reader.h"

#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <future>

#include "formats/base/file_io.h"
#include "formats/base/thread_name.h"
#include "formats/store/h5/h5_handles.h"
#include "formats/store/h5/zstd_filter.h"

namespace ckpt::store {

namespace {

// The last chunk this thread decoded.
struct DecodedChunk {
  uint64_t uid = 0;
  uint64_t chunk = UINT64_MAX;
  std::vector<char> bytes;
};

// The stored (filtered) bytes of chunk c: located under h5_lock(), read outside it when the file
// has a descriptor (reads of several threads overlap), else with H5Dread_chunk under the lock.
Status read_stored_chunk(const ChunkedDataset& d, uint64_t c, std::vector<char>& stored) {
  const size_t bytes = d.grid.chunk_elems() * d.esize;
  const std::vector<hsize_t> off = d.grid.offset(c);
  hsize_t n = 0;
  haddr_t addr = HADDR_UNDEF;
  unsigned mask = 0;
  {
    auto lock = h5_lock();
    if (H5Dget_chunk_info_by_coord(d.ds, off.data(), &mask, &addr, &n) < 0 || n == 0 || n > ZSTD_compressBound(bytes) || addr == HADDR_UNDEF)
      return Status::Error("ChunkCorrupt", "chunk " + std::to_string(c) + " is missing or " + std::to_string(n) + " bytes stored for " +
                                               std::to_string(bytes) + " bytes of data");
    if (mask != 0) return Status::Error("ChunkCorrupt", "chunk " + std::to_string(c) + " skips filters (mask " + std::to_string(mask) + ")");
    stored.resize(n);
    if (d.fd < 0) {
      uint32_t m = 0;
      if (H5Dread_chunk(d.ds, H5P_DEFAULT, off.data(), &m, stored.data()) < 0 || m != 0)
        return Status::Error("ChunkCorrupt", "raw read of chunk " + std::to_string(c) + " failed");
      return Status::Ok();
    }
  }
  Status st = pread_full(d.fd, stored.data(), n, addr, "shard");
  if (!st.ok())
    return Status::Error("ChunkCorrupt", "chunk " + std::to_string(c) + ": " + std::to_string(n) + " bytes stored at offset " + std::to_string(addr) +
                                             ": " + st.message());
  return Status::Ok();
}

thread_local std::vector<char> tl_stored_chunk;  // this thread's raw read buffer (reused)

// Chunk c decoded straight into dst (chunk_elems * esize bytes): a read that covers the whole
// chunk needs no copy through the per-thread cache.
Status decode_chunk_into(const ChunkedDataset& d, uint64_t c, void* dst) {
  CKPT_RETURN_IF_ERROR(read_stored_chunk(d, c, tl_stored_chunk));
  const Status st = decode_chunk(d.codec, d.esize, tl_stored_chunk.data(), tl_stored_chunk.size(), dst, d.grid.chunk_elems() * d.esize);
  return st.ok() ? st : Status::Error(st.code(), "chunk " + std::to_string(c) + ": " + st.message());
}

Result<const std::vector<char>*> fetch_chunk(const ChunkedDataset& d, uint64_t c) {
  thread_local DecodedChunk cache;
  if (cache.uid == d.uid && cache.chunk == c) return &cache.bytes;
  cache.uid = 0;
  const size_t bytes = d.grid.chunk_elems() * d.esize;
  CKPT_RETURN_IF_ERROR(read_stored_chunk(d, c, tl_stored_chunk));
  cache.bytes.resize(bytes);
  const Status st = decode_chunk(d.codec, d.esize, tl_stored_chunk.data(), tl_stored_chunk.size(), cache.bytes.data(), bytes);
  if (!st.ok()) return Status::Error(st.code(), "chunk " + std::to_string(c) + ": " + st.message());
  cache.uid = d.uid;
  cache.chunk = c;
  return &cache.bytes;
}

Box chunk_box(const ChunkGrid& g, uint64_t c) {
  const std::vector<hsize_t> off = g.offset(c);
  Box b;
  for (size_t i = 0; i < g.dims.size(); ++i) {
    b.offset.push_back(static_cast<int64_t>(off[i]));
    b.extent.push_back(static_cast<int64_t>(std::min<hsize_t>(g.chunk[i], g.dims[i] - off[i])));
  }
  return b;
}

// Runs place(c) for every chunk c of `chunks`: in order on the calling thread, or, with a pool and
// several chunks, on the pool and the calling thread at once; the first error.
Status for_each_chunk(const ChunkedDataset& d, const std::vector<uint64_t>& chunks, const std::function<Status(uint64_t)>& place) {
  if (!d.decode_pool || chunks.size() < 2) {
    for (uint64_t c : chunks) CKPT_RETURN_IF_ERROR(place(c));
    return Status::Ok();
  }
  std::atomic<size_t> next{0};
  auto worker = [&]() -> Status {
    for (size_t i; (i = next.fetch_add(1)) < chunks.size();) {
      Status st = place(chunks[i]);
      if (!st.ok()) {
        next.store(chunks.size());
        return st;
      }
    }
    return Status::Ok();
  };
  std::vector<std::future<Status>> helpers;
  const size_t n = std::min<size_t>(static_cast<size_t>(d.decode_pool->size()), chunks.size() - 1);
  for (size_t i = 0; i < n; ++i)
    helpers.push_back(d.decode_pool->submit([&worker] {
      name_store_thread("ckpt-decode");
      return worker();
    }));
  Status first = worker();
  for (auto& h : helpers) {
    Status st = h.get();
    if (first.ok() && !st.ok()) first = std::move(st);
  }
  return first;
}

}  // namespace

uint64_t next_chunked_uid() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}

std::optional<ChunkGrid> chunk_grid_of(hid_t ds, const std::vector<hsize_t>& dims, Codec codec, size_t esize) {
  auto lock = h5_lock();
  H5Id dcpl(H5Dget_create_plist(ds), H5Pclose);
  if (!dcpl.valid() || H5Pget_layout(dcpl.get()) != H5D_CHUNKED) return std::nullopt;
  // Filters: [shuffle,] zstd, nothing else.
  const bool want_shuffle = codec == Codec::kShuffleZstd && esize > 1;
  const int nf = H5Pget_nfilters(dcpl.get());
  if (nf != (want_shuffle ? 2 : 1)) return std::nullopt;
  for (int i = 0; i < nf; ++i) {
    unsigned flags = 0, cd[8];
    size_t ncd = 8;
    const H5Z_filter_t f = H5Pget_filter2(dcpl.get(), static_cast<unsigned>(i), &flags, &ncd, cd, 0, nullptr, nullptr);
    if (f != (want_shuffle && i == 0 ? H5Z_FILTER_SHUFFLE : static_cast<H5Z_filter_t>(kZstdFilterId))) return std::nullopt;
  }
  return chunk_grid_of_plist(dcpl.get(), dims, esize);
}

std::optional<ChunkGrid> chunk_grid_of_plist(hid_t dcpl, const std::vector<hsize_t>& dims, size_t esize) {
  auto lock = h5_lock();
  std::vector<hsize_t> chunk(dims.size());
  if (dims.empty() || H5Pget_chunk(dcpl, static_cast<int>(dims.size()), chunk.data()) != static_cast<int>(dims.size()))
    return std::nullopt;
  for (hsize_t c : chunk)
    if (c == 0) return std::nullopt;  // before ChunkGrid::of divides by it
  ChunkGrid g = ChunkGrid::of(dims, chunk);
  uint64_t bytes = esize;
  for (size_t d = 0; d < dims.size(); ++d) {
    if (chunk[d] == 0 || (d < g.k && chunk[d] != 1) || (d > g.k && chunk[d] != dims[d])) return std::nullopt;
    bytes *= chunk[d];
  }
  if (bytes > kZstdMaxChunkBytes) return std::nullopt;
  return g;
}

Status read_chunked_box(const ChunkedDataset& d, const Box& sub, void* dst) {
  if (sub.numel() == 0) return Status::Ok();
  const ChunkGrid& g = d.grid;
  // Chunks meeting `sub`: every index of the dims before k, the chunk rows of dim k it spans.
  const size_t k = g.k;
  std::vector<int64_t> idx(sub.offset.begin(), sub.offset.begin() + static_cast<long>(k));
  const uint64_t j0 = static_cast<uint64_t>(sub.offset[k]) / g.chunk[k];
  const uint64_t j1 = static_cast<uint64_t>(sub.offset[k] + sub.extent[k] - 1) / g.chunk[k];
  std::vector<uint64_t> chunks;
  for (bool more = true; more;) {
    uint64_t outer = 0;
    for (size_t i = 0; i < k; ++i) outer = outer * g.dims[i] + static_cast<uint64_t>(idx[i]);
    for (uint64_t j = j0; j <= j1; ++j) chunks.push_back(outer * g.per_run + j);
    more = false;
    for (size_t i = k; i-- > 0;) {
      if (++idx[i] < sub.offset[i] + sub.extent[i]) {
        more = true;
        break;
      }
      idx[i] = sub.offset[i];
    }
  }
  // A whole chunk inside `sub` is one run of dst when `sub` takes the dims after k whole.
  bool trailing_whole = true;
  for (size_t i = k + 1; i < g.dims.size(); ++i) trailing_whole = trailing_whole && static_cast<hsize_t>(sub.extent[i]) == g.dims[i];
  return for_each_chunk(d, chunks, [&](uint64_t c) -> Status {
    Box cb = chunk_box(g, c);
    if (trailing_whole && static_cast<hsize_t>(cb.extent[k]) == g.chunk[k] && sub.contains(cb)) {
      uint64_t at = 0;  // cb's first element in dst (row-major over sub)
      for (size_t i = 0; i < g.dims.size(); ++i) at = at * static_cast<uint64_t>(sub.extent[i]) + static_cast<uint64_t>(cb.offset[i] - sub.offset[i]);
      return decode_chunk_into(d, c, static_cast<char*>(dst) + at * d.esize);
    }
    CKPT_ASSIGN_OR_RETURN(const std::vector<char>* buf, fetch_chunk(d, c));
    Box full = cb;  // the stored chunk's own extent (edge chunks are stored full size)
    full.extent[k] = static_cast<int64_t>(g.chunk[k]);
    auto inter = intersect(cb, sub);
    if (inter) copy_box(buf->data(), full, dst, sub, *inter, d.esize);
    return Status::Ok();
  });
}

Status read_chunked_range(const ChunkedDataset& d, uint64_t begin, uint64_t end, void* dst) {
  if (begin >= end) return Status::Ok();
  char* out = static_cast<char*>(dst);
  std::vector<uint64_t> chunks;
  for (uint64_t c = d.grid.chunk_of(begin), last = d.grid.chunk_of(end - 1); c <= last; ++c) chunks.push_back(c);
  return for_each_chunk(d, chunks, [&](uint64_t c) -> Status {
    const uint64_t first = d.grid.first(c);
    const uint64_t a = std::max(begin, first), b = std::min(end, first + d.grid.valid(c));
    if (a == first && b - a == d.grid.chunk_elems()) return decode_chunk_into(d, c, out + (a - begin) * d.esize);
    CKPT_ASSIGN_OR_RETURN(const std::vector<char>* buf, fetch_chunk(d, c));
    std::memcpy(out + (a - begin) * d.esize, buf->data() + (a - first) * d.esize, (b - a) * d.esize);
    return Status::Ok();
  });
}

}  // namespace ckpt::store
