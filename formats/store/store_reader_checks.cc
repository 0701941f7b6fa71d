// StoreReader's checks (formats/store/store_reader.h): the HDF5 storage of every dataset against
// its piece record at open (check_storage: layout, filters, size, range, chunk shape), and the
// piece digests (hash_piece, verify, verify_pieces) behind TensorSource's integrity interface
// (integrity, check, check_piece, range_check).
#include "formats/store/store_reader.h"

#include <algorithm>
#include <set>

#include "formats/base/thread_pool.h"
#include "formats/digest/digest.h"
#include "formats/dtype/dtype.h"
#include "formats/io/source_window.h"
#include "formats/store/h5/zstd_filter.h"

namespace ckpt::store {

namespace {
// Pieces not hashed straight from their file range (compressed, or read through HDF5) are read
// this many bytes at a time per verifying thread: one 4 MiB compressed chunk, decoded straight
// into the buffer (16 MiB buffers made `ckpt verify` of a compressed store peak at 106 MiB, and
// so reshard's background source check, which counts in --max-memory).
constexpr uint64_t kVerifyChunkBytes = 4ull << 20;


std::string layout_name(H5D_layout_t l) {
  switch (l) {
    case H5D_COMPACT: return "compact";
    case H5D_CONTIGUOUS: return "contiguous";
    case H5D_CHUNKED: return "chunked";
    case H5D_VIRTUAL: return "virtual";
    default: return "unknown (" + std::to_string(static_cast<int>(l)) + ")";
  }
}

std::string filter_name(H5Z_filter_t f) {
  if (f == H5Z_FILTER_SHUFFLE) return "shuffle (2)";
  if (f == static_cast<H5Z_filter_t>(kZstdFilterId)) return "zstd (" + std::to_string(kZstdFilterId) + ")";
  return "filter " + std::to_string(f);
}

std::string filters_string(const std::vector<H5Z_filter_t>& fs) {
  std::string s = "[";
  for (size_t i = 0; i < fs.size(); ++i) s += (i ? ", " : "") + filter_name(fs[i]);
  return s + "]";
}
}  // namespace

Status StoreReader::check_storage(size_t i, hid_t ds, uint64_t file_size, const std::string& path, const std::string& where) {
  const auto& rec = manifest_.pieces[i];
  auto fail = [&](const char* code, const std::string& what) {
    return Status::Error(code, where + ": " + what).with_file(path).with_tensor(rec.piece.tensor);
  };
  H5Id dcpl(H5Dget_create_plist(ds), H5Pclose);
  const H5D_layout_t layout = dcpl.valid() ? H5Pget_layout(dcpl.get()) : H5D_LAYOUT_ERROR;
  const int nf = dcpl.valid() ? H5Pget_nfilters(dcpl.get()) : -1;
  const std::string codec = codec_name(rec.codec);
  if (rec.codec == Codec::kNone) {
    // As the writer stores it: contiguous, unfiltered, exactly rec.bytes at an address inside the
    // file. A layout message whose size disagrees would make HDF5's hyperslab reads misplace rows.
    if (layout != H5D_CONTIGUOUS)
      return fail("LayoutMismatch", "dataset layout is " + layout_name(layout) + ", expected contiguous (manifest codec none)");
    if (nf != 0)
      return fail("FilterMismatch", "dataset has " + std::to_string(nf) + " filters, expected none (manifest codec none)");
    const hsize_t stored = H5Dget_storage_size(ds);
    if (stored != rec.bytes)
      return fail("StorageSizeMismatch", "dataset storage size (HDF5 layout message) is " + std::to_string(stored) + " bytes, expected " +
                                             std::to_string(rec.bytes) + " (manifest bytes: " + std::to_string(rec.piece.region.numel()) +
                                             " x " + std::string(dtype_name(rec.piece.dtype)) + ")");
    if (rec.bytes > 0) {
      const haddr_t a = H5Dget_offset(ds);
      if (a == HADDR_UNDEF || a > file_size || file_size - a < rec.bytes || a > static_cast<haddr_t>(INT64_MAX))
        return fail("StorageOutOfFile", "dataset data at " + (a == HADDR_UNDEF ? std::string("no file address") : "offset " + std::to_string(a)) +
                                            " (+" + std::to_string(rec.bytes) + " bytes) is not inside the file (" + std::to_string(file_size) +
                                            " bytes)");
      raw_offsets_[i] = static_cast<int64_t>(a);
    }
    return Status::Ok();
  }
  // Compressed: chunked, with exactly the codec's filters ([shuffle,] zstd; the writer omits the
  // shuffle for 1-byte elements, where it is the identity: h5py keeps it, which is read by HDF5).
  if (layout != H5D_CHUNKED)
    return fail("LayoutMismatch", "dataset layout is " + layout_name(layout) + ", expected chunked (manifest codec " + codec + ")");
  const size_t es = dtype_size(rec.piece.dtype);
  std::vector<H5Z_filter_t> want = {static_cast<H5Z_filter_t>(kZstdFilterId)};
  if (rec.codec == Codec::kShuffleZstd && es > 1) want.insert(want.begin(), H5Z_FILTER_SHUFFLE);
  std::vector<H5Z_filter_t> got;
  for (int f = 0; f < std::min(nf, 16); ++f) {
    unsigned flags = 0, cd[8];
    size_t ncd = 8;
    got.push_back(H5Pget_filter2(dcpl.get(), static_cast<unsigned>(f), &flags, &ncd, cd, 0, nullptr, nullptr));
  }
  const bool identity_shuffle = rec.codec == Codec::kShuffleZstd && es == 1 &&
                                got == std::vector<H5Z_filter_t>{H5Z_FILTER_SHUFFLE, static_cast<H5Z_filter_t>(kZstdFilterId)};
  if (identity_shuffle) return Status::Ok();  // HDF5's own path
  if (nf < 0 || got != want)
    return fail("FilterMismatch", "dataset filters are " + filters_string(got) + (nf > 16 ? " ..." : "") + ", expected " + filters_string(want) +
                                      " (manifest codec " + codec + ")");
  const auto dims = piece_dataset_dims(rec.piece.region);
  if (auto g = chunk_grid_of_plist(dcpl.get(), dims, es)) {
    chunked_[i] = ChunkedDataset{next_chunked_uid(), ds, *g, rec.codec, es};
  } else if (manifest_.version >= kFirstChecksummedVersion) {
    // Version 3 stores are ckpt's writer's: other chunk shapes (h5py's, in hand-made v1/v2 stores)
    // are read through HDF5's own path there only.
    std::vector<hsize_t> chunk(dims.size());
    const int nd = H5Pget_chunk(dcpl.get(), static_cast<int>(dims.size()), chunk.data());
    return fail("ChunkShapeMismatch", "dataset chunk dims " + (nd == static_cast<int>(dims.size()) ? dims_string(chunk) : std::string("unreadable")) +
                                          " for dims " + dims_string(dims) +
                                          " are not the store writer's (1 before one cut dim, whole after it, at most " +
                                          std::to_string(kZstdMaxChunkBytes) + " bytes a chunk)");
  }
  return Status::Ok();
}

Status StoreReader::hash_piece(size_t i, const std::optional<FileExtent>& raw, std::string* hex) {
  const auto& rec = manifest_.pieces[i];
  Digest h(rec.digest.algo);
  if (raw) {
    CKPT_RETURN_IF_ERROR(read_file_blocks_io(raw->fd, raw->offset, raw->bytes, read_io_, dir_ + "/" + rec.file,
                                             [&h](const void* p, size_t n) { h.update(p, n); }));
  } else {
    const size_t esize = dtype_size(rec.piece.dtype);
    const int64_t step = static_cast<int64_t>(std::max<uint64_t>(1, kVerifyChunkBytes / esize));
    const int64_t numel = rec.piece.region.numel();
    std::vector<char> buf(static_cast<size_t>(std::min(step, numel)) * esize);
    for (int64_t pos = 0; pos < numel; pos += step) {
      const int64_t end = std::min(pos + step, numel);
      CKPT_RETURN_IF_ERROR(read_storage_range(i, pos, end, buf.data()));
      h.update(buf.data(), static_cast<size_t>(end - pos) * esize);
    }
  }
  *hex = h.hex_digest();
  return Status::Ok();
}

IntegrityInfo StoreReader::integrity() const {
  std::set<std::string> algos;
  for (const auto& rec : manifest_.pieces) algos.insert(digest_algo_name(rec.digest.algo));
  std::string scheme;
  for (const auto& a : algos) scheme += (scheme.empty() ? "" : " + ") + a;
  // Versions before 3 carry no manifest checksum: the piece digests cover the bytes, not what the
  // manifest says they are.
  std::string cannot_check;
  if (manifest_.version < kFirstChecksummedVersion)
    cannot_check = "manifest v" + std::to_string(manifest_.version) +
                   " has no manifest checksum: a relabelled dtype, shape, region or codec is not detectable";
  return {std::string(kFormatName) + " v" + std::to_string(manifest_.version), (scheme.empty() ? "no" : scheme) + " piece digests",
          std::move(cannot_check), std::vector<std::string>(algos.begin(), algos.end())};
}

CheckReport StoreReader::check(const CheckOptions& o) {
  std::vector<size_t> which;
  const size_t shares = static_cast<size_t>(std::max(1, o.shares));
  for (size_t i = 0; i < manifest_.pieces.size(); ++i)
    if (i % shares == static_cast<size_t>(o.share)) which.push_back(i);
  const IoMode before = read_io_;
  read_io_ = o.io;
  CheckReport rep = verify_pieces(which, o.progress, o.threads);
  read_io_ = before;
  return rep;
}

Status StoreReader::check_piece(size_t piece) {
  if (piece >= manifest_.pieces.size()) return Status::InvalidArgument("piece index " + std::to_string(piece) + " out of range");
  std::lock_guard<std::mutex> g(checked_mu_);
  if (checked_.empty()) checked_.assign(manifest_.pieces.size(), 0);
  if (checked_[piece] == 1) return Status::Ok();
  if (checked_[piece] == 2) return check_failed_[piece];
  CheckReport rep = verify_pieces({piece}, nullptr, 1);
  if (rep.ok()) {
    checked_[piece] = 1;
    return Status::Ok();
  }
  checked_[piece] = 2;
  return check_failed_[piece] = rep.failures.front().status;
}

std::optional<RangeCheck> StoreReader::range_check(size_t piece) {
  if (piece >= manifest_.pieces.size() || manifest_.pieces[piece].codec != Codec::kNone) return std::nullopt;
  const std::optional<FileExtent> e = dataset_extent(piece);
  if (!e) return std::nullopt;
  return RangeCheck{*e, manifest_.pieces[piece].digest};
}

PieceStorage StoreReader::piece_storage(size_t piece) {
  if (piece >= manifest_.pieces.size()) return {};
  const auto& rec = manifest_.pieces[piece];
  std::string codec = codec_name(rec.codec);
  if (rec.codec != Codec::kNone) codec += "-" + std::to_string(rec.codec_level);
  return {rec.file, stored_bytes(piece), codec};
}

VerifyReport StoreReader::verify(const std::function<void(uint64_t, uint64_t)>& progress, int threads) {
  std::vector<size_t> all(manifest_.pieces.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  return verify_pieces(all, progress, threads);
}

VerifyReport StoreReader::verify_pieces(const std::vector<size_t>& which,
                                        const std::function<void(uint64_t, uint64_t)>& progress, int threads) {
  VerifyReport rep;
  const size_t n = which.size();
  uint64_t total = 0;
  for (size_t i : which) total += manifest_.pieces[i].bytes;
  std::vector<std::optional<FileExtent>> raw(n);
  for (size_t k = 0; k < n; ++k) raw[k] = dataset_extent(which[k]);  // on this thread: the lookup is not thread-safe
  std::vector<Status> status(n);
  std::vector<std::string> got(n);
  std::vector<std::future<void>> done(n);
  {
    ThreadPool pool(std::max(1, threads));
    for (size_t k = 0; k < n; ++k)
      done[k] = pool.submit([this, k, &which, &raw, &status, &got] { status[k] = hash_piece(which[k], raw[k], &got[k]); });
    uint64_t bytes = 0;
    for (size_t k = 0; k < n; ++k) {
      done[k].get();
      bytes += manifest_.pieces[which[k]].bytes;
      if (progress) progress(bytes, total);
    }
  }
  for (size_t k = 0; k < n; ++k) {
    const size_t i = which[k];
    const auto& rec = manifest_.pieces[i];
    ++rep.pieces;
    rep.bytes += rec.bytes;
    if (!status[k].ok()) {
      rep.failures.push_back({i, error_context(std::move(status[k]), i), rec.piece.tensor, rec.file, rec.dataset});
      continue;
    }
    if (got[k] != rec.digest.hex)
      rep.failures.push_back({i, error_context(Status::Error("ChecksumMismatch",
                                                             "tensor '" + rec.piece.tensor + "' piece #" + std::to_string(i) + " region " +
                                                                 rec.piece.region.to_string() + " (file '" + rec.file + "', dataset '" + rec.dataset +
                                                                 "'): " + digest_algo_name(rec.digest.algo) + " expected " + rec.digest.hex +
                                                                 ", got " + got[k]),
                                             i),
                              rec.piece.tensor, rec.file, rec.dataset});
  }
  return rep;
}

}  // namespace ckpt::store
