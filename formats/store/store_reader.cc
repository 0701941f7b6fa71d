#include "formats/store/store_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "formats/checked.h"
#include "formats/dtype.h"
#include "formats/file_io.h"
#include "formats/file_read_direct.h"
#include "formats/store/h5_types.h"
#include "formats/store/run_dir.h"
#include "formats/digest.h"
#include "formats/thread_pool.h"
#include "formats/store/zstd_filter.h"

namespace ckpt::store {

namespace {
// Pieces not hashed straight from their file range (compressed, or read through HDF5) are read
// this many bytes at a time per verifying thread: one 4 MiB compressed chunk, decoded straight
// into the buffer (16 MiB buffers made `ckpt verify` of a compressed store peak at 106 MiB, and
// so reshard's background source check, which counts in --max-memory: issue 15).
constexpr uint64_t kVerifyChunkBytes = 4ull << 20;

std::string dims_string(const std::vector<hsize_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

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

StoreReader::~StoreReader() {
  for (auto& [_, fd] : fds_)
    if (fd >= 0) ::close(fd);
  auto lock = h5_lock();
  datasets_.clear();
  files_.clear();
}

Result<std::unique_ptr<StoreReader>> StoreReader::open(const std::string& path) {
  CKPT_RETURN_IF_ERROR(register_zstd_filter());
  CKPT_ASSIGN_OR_RETURN(std::string dir, resolve_checkpoint(path));
  std::unique_ptr<StoreReader> r(new StoreReader());
  r->dir_ = dir;
  CKPT_ASSIGN_OR_RETURN(r->manifest_, load_manifest(dir));
  r->pieces_.reserve(r->manifest_.pieces.size());
  for (const auto& rec : r->manifest_.pieces) r->pieces_.push_back(rec.piece);
  CKPT_RETURN_IF_ERROR(r->open_files());
  return r;
}

Status StoreReader::error_context(Status st, size_t piece) const {
  const auto& rec = manifest_.pieces[piece];
  return std::move(st).with_file(dir_ + "/" + rec.file).with_tensor(rec.piece.tensor);
}

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

Status StoreReader::open_files() {
  auto lock = h5_lock();
  datasets_.resize(manifest_.pieces.size());
  chunked_.resize(manifest_.pieces.size());
  raw_offsets_.assign(manifest_.pieces.size(), -1);
  std::unordered_map<std::string, uint64_t> file_sizes;
  for (size_t i = 0; i < manifest_.pieces.size(); ++i) {
    const auto& rec = manifest_.pieces[i];
    const std::string path = dir_ + "/" + rec.file;
    const std::string where = "piece #" + std::to_string(i) + " of tensor '" + rec.piece.tensor + "' (file '" + rec.file +
                              "', dataset '" + rec.dataset + "')";
    auto fit = files_.find(rec.file);
    if (fit == files_.end()) {
      struct stat st {};
      if (::stat(path.c_str(), &st) != 0)
        return Status::Error("ShardMissing", "shard file '" + rec.file + "' is missing (needed by " + where + ")")
            .with_file(path).with_tensor(rec.piece.tensor);
      if (!S_ISREG(st.st_mode))
        return Status::Error("BadShard", "shard '" + rec.file + "' is not a regular file").with_file(path);
      H5Id f = h5_file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
      if (!f.valid())
        return Status::Error("BadShard", "shard '" + rec.file + "' (" + std::to_string(st.st_size) +
                                                  " bytes) is not a readable HDF5 file (truncated or damaged)")
            .with_file(path);
      fit = files_.emplace(rec.file, std::move(f)).first;
      file_sizes[rec.file] = static_cast<uint64_t>(st.st_size);
    }
    H5Id ds = h5_dataset(H5Dopen2(fit->second.get(), rec.dataset.c_str(), H5P_DEFAULT));
    if (!ds.valid())
      return Status::Error("MissingDataset", where + ": dataset not found or unreadable").with_file(path).with_tensor(rec.piece.tensor);
    H5Id type = h5_type(H5Dget_type(ds.get()));
    if (!type.valid() || !h5_type_matches(type.get(), rec.piece.dtype))
      return Status::Error("DTypeMismatch", where + ": dataset element type (class " + std::to_string(type.valid() ? H5Tget_class(type.get()) : -1) +
                                                     ", " + std::to_string(type.valid() ? H5Tget_size(type.get()) : 0) + " bytes) does not hold " +
                                                     std::string(dtype_name(rec.piece.dtype)))
          .with_file(path).with_tensor(rec.piece.tensor);
    H5Id space = h5_space(H5Dget_space(ds.get()));
    const auto want = piece_dataset_dims(rec.piece.region);
    int nd = space.valid() ? H5Sget_simple_extent_ndims(space.get()) : -1;
    std::vector<hsize_t> got(nd > 0 ? static_cast<size_t>(nd) : 0);
    if (nd >= 0 && nd <= 64 && nd > 0) H5Sget_simple_extent_dims(space.get(), got.data(), nullptr);
    if (nd < 0 || nd > 64 || got != want)
      return Status::Error("ShapeMismatch", where + ": dataset shape " + dims_string(got) + ", expected " + dims_string(want))
          .with_file(path).with_tensor(rec.piece.tensor);
    CKPT_RETURN_IF_ERROR(check_storage(i, ds.get(), file_sizes[rec.file], path, where));
    if (chunked_[i]) chunked_[i]->fd = h5_posix_fd(fit->second.get());
    datasets_[i] = std::move(ds);
  }
  return Status::Ok();
}

Status StoreReader::read(size_t piece, const Box& sub, void* dst) {
  if (piece >= pieces_.size()) return Status::InvalidArgument("piece index " + std::to_string(piece) + " out of range");
  const auto& rec = manifest_.pieces[piece];
  const Region& reg = rec.piece.region;
  if (sub.ndim() != reg.box.ndim()) return error_context(Status::InvalidArgument("sub-box " + sub.to_string() + " has the wrong rank"), piece);
  for (size_t d = 0; d < sub.ndim(); ++d)
    if (sub.offset[d] < 0 || sub.extent[d] < 0) return error_context(Status::InvalidArgument("sub-box " + sub.to_string() + " is negative"), piece);
  if (chunked_[piece] && !reg.is_flat() && reg.box.contains(sub)) {
    Box local = sub;
    for (size_t d = 0; d < sub.ndim(); ++d) local.offset[d] -= reg.box.offset[d];
    if (sub.ndim() == 0) local = Box{{0}, {1}};
    Status st = read_chunked_box(*chunked_[piece], local, dst);
    return st.ok() ? st : error_context(std::move(st).with_context("reading dataset " + rec.dataset), piece);
  }
  auto lock = h5_lock();
  H5Id fspace = h5_space(H5Dget_space(datasets_[piece].get()));
  const size_t n = sub.ndim();
  if (!reg.is_flat()) {
    if (!reg.box.contains(sub))
      return error_context(Status::InvalidArgument("sub-box " + sub.to_string() + " is not inside piece " + reg.to_string()), piece);
    if (sub.numel() == 0) return Status::Ok();
    std::vector<hsize_t> off(std::max<size_t>(n, 1), 0), cnt(std::max<size_t>(n, 1), 1);
    for (size_t d = 0; d < n; ++d) {
      off[d] = static_cast<hsize_t>(sub.offset[d] - reg.box.offset[d]);
      cnt[d] = static_cast<hsize_t>(sub.extent[d]);
    }
    if (H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, off.data(), nullptr, cnt.data(), nullptr) < 0)
      return error_context(Status::Internal("hyperslab selection failed"), piece);
  } else {
    // Find the box of the flat range holding `sub`; its elements start at `base` in the dataset.
    int64_t base = 0;
    const Box* holder = nullptr;
    std::vector<Box> boxes = reg.boxes();
    for (const Box& b : boxes) {
      if (b.contains(sub)) {
        holder = &b;
        break;
      }
      base += b.numel();
    }
    if (!holder)
      return error_context(Status::InvalidArgument("sub-box " + sub.to_string() + " is not inside one box of flat piece " + reg.to_string()), piece);
    if (sub.numel() == 0) return Status::Ok();
    H5Sselect_none(fspace.get());
    if (n == 0) {
      hsize_t o = static_cast<hsize_t>(base), c = 1;
      H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, &o, nullptr, &c, nullptr);
    } else {
      // Row-major strides of `holder`; iterate over all dims but the last two, select the last two
      // as a strided 1-D pattern: count rows of `block` elements, `stride` apart.
      std::vector<int64_t> stride(n);
      int64_t s = 1;
      for (size_t d = n; d-- > 0;) {
        stride[d] = s;
        s *= holder->extent[d];
      }
      const size_t outer = n >= 2 ? n - 2 : 0;
      const hsize_t block = static_cast<hsize_t>(sub.extent[n - 1]);
      const hsize_t rows = n >= 2 ? static_cast<hsize_t>(sub.extent[n - 2]) : 1;
      const hsize_t row_stride = std::max<hsize_t>(n >= 2 ? static_cast<hsize_t>(stride[n - 2]) : 1, block);
      std::vector<int64_t> idx(outer, 0);
      for (bool more = true; more;) {
        int64_t start = base;
        for (size_t d = 0; d < n; ++d) start += ((sub.offset[d] - holder->offset[d]) + (d < outer ? idx[d] : 0)) * stride[d];
        hsize_t st = static_cast<hsize_t>(start), str = row_stride, cnt = rows, blk = block;
        if (H5Sselect_hyperslab(fspace.get(), H5S_SELECT_OR, &st, &str, &cnt, &blk) < 0)
          return error_context(Status::Internal("hyperslab selection failed"), piece);
        more = false;
        for (size_t d = outer; d-- > 0;) {
          if (++idx[d] < sub.extent[d]) {
            more = true;
            break;
          }
          idx[d] = 0;
        }
      }
    }
  }
  hsize_t total = static_cast<hsize_t>(sub.numel());
  // A rectangular sub-box: memory space of the box's own shape (fast chunk mapping); a flat piece
  // (1-D dataset, union of strided runs): a 1-D memory space.
  std::vector<hsize_t> mdims(1, total);
  if (!reg.is_flat() && n > 0) mdims.assign(sub.extent.begin(), sub.extent.end());
  H5Id mspace = h5_space(H5Screate_simple(static_cast<int>(mdims.size()), mdims.data(), nullptr));
  if (H5Dread(datasets_[piece].get(), h5_type_for(rec.piece.dtype), mspace.get(), fspace.get(), H5P_DEFAULT, dst) < 0)
    return error_context(Status::Error("ReadFailed", "reading " + sub.to_string() + " of dataset '" + rec.dataset + "' in '" + rec.file +
                                                              "' failed (damaged data or compressed chunk)"),
                         piece);
  return Status::Ok();
}

std::optional<FileExtent> StoreReader::dataset_extent(size_t piece) {
  // The range was checked at open (check_storage): an uncompressed, non-empty piece always has one.
  if (piece >= pieces_.size() || raw_offsets_[piece] < 0) return std::nullopt;
  const auto& rec = manifest_.pieces[piece];
  auto [fit, opened] = fds_.try_emplace(rec.file, -1);
  if (opened) fit->second = ::open((dir_ + "/" + rec.file).c_str(), O_RDONLY | O_CLOEXEC);
  if (fit->second < 0) return std::nullopt;  // cannot open the file a second time: the same bytes through HDF5
  return FileExtent{fit->second, static_cast<uint64_t>(raw_offsets_[piece]), rec.bytes};
}

std::optional<FileExtent> StoreReader::file_extent(size_t piece, const Box& sub) {
  if (piece >= pieces_.size()) return std::nullopt;
  const auto& rec = manifest_.pieces[piece];
  if (rec.piece.region.is_flat()) return std::nullopt;
  const std::optional<int64_t> start = row_major_run_start(rec.piece.region.box, sub);
  if (!start) return std::nullopt;
  std::optional<FileExtent> e = dataset_extent(piece);
  if (!e) return std::nullopt;
  const uint64_t es = dtype_size(rec.piece.dtype);
  return FileExtent{e->fd, e->offset + static_cast<uint64_t>(*start) * es, static_cast<uint64_t>(sub.numel()) * es};
}

void StoreReader::set_decode_threads(int threads) {
  for (auto& c : chunked_)
    if (c) c->decode_pool = nullptr;
  decode_pool_.reset();
  if (threads < 2) return;
  decode_pool_ = std::make_unique<ThreadPool>(threads - 1);
  for (auto& c : chunked_)
    if (c) c->decode_pool = decode_pool_.get();
}

Status StoreReader::read_storage_range(size_t piece, int64_t begin, int64_t end, void* dst) {
  if (piece >= pieces_.size()) return Status::InvalidArgument("piece index " + std::to_string(piece) + " out of range");
  const auto& rec = manifest_.pieces[piece];
  const int64_t numel = rec.piece.region.numel();
  if (begin < 0 || begin > end || end > numel)
    return error_context(Status::InvalidArgument("range " + std::to_string(begin) + ".." + std::to_string(end) + " outside piece of " +
                                                 std::to_string(numel) + " elements"),
                         piece);
  if (begin == end) return Status::Ok();
  if (chunked_[piece]) {
    Status st = read_chunked_range(*chunked_[piece], static_cast<uint64_t>(begin), static_cast<uint64_t>(end), dst);
    return st.ok() ? st : error_context(std::move(st).with_context("reading dataset " + rec.dataset), piece);
  }
  const auto dims = piece_dataset_dims(rec.piece.region);
  const size_t esize = dtype_size(rec.piece.dtype);
  auto lock = h5_lock();
  char* out = static_cast<char*>(dst);
  for (const Box& b : flat_range_to_boxes(Box::whole(Shape(dims.begin(), dims.end())), begin, end)) {
    std::vector<hsize_t> off(b.offset.begin(), b.offset.end()), cnt(b.extent.begin(), b.extent.end());
    hsize_t n = static_cast<hsize_t>(b.numel());
    H5Id fspace = h5_space(H5Dget_space(datasets_[piece].get()));
    // Memory space shaped like the selection (fast chunk mapping; see store_writer.cc).
    H5Id mspace = h5_space(H5Screate_simple(static_cast<int>(cnt.size()), cnt.data(), nullptr));
    if (H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, off.data(), nullptr, cnt.data(), nullptr) < 0 ||
        H5Dread(datasets_[piece].get(), h5_type_for(rec.piece.dtype), mspace.get(), fspace.get(), H5P_DEFAULT, out) < 0)
      return error_context(Status::Error("ReadFailed", "reading elements " + std::to_string(begin) + ".." + std::to_string(end) + " of dataset '" +
                                                                rec.dataset + "' in '" + rec.file + "' failed (damaged data or compressed chunk)"),
                           piece);
    out += n * esize;
  }
  return Status::Ok();
}

uint64_t StoreReader::stored_bytes(size_t piece) {
  if (piece >= datasets_.size()) return 0;
  auto lock = h5_lock();
  return H5Dget_storage_size(datasets_[piece].get());
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

uint64_t StoreReader::read_memory(int threads) const {
  const uint64_t shares = threads > 1 ? 2 * static_cast<uint64_t>(threads) - 1 : 1;
  for (const auto& rec : manifest_.pieces)
    if (rec.codec != Codec::kNone) return shares * kDecodeThreadBytes;
  return 0;
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
                                                                 "'): " + digest_algo_name(rec.digest.algo) + " expected " + rec.digest.hex + ", got " + got[k]),
                                             i),
                              rec.piece.tensor, rec.file, rec.dataset});
  }
  return rep;
}

}  // namespace ckpt::store
