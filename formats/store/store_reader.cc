#include "formats/store/store_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "formats/base/checked.h"
#include "formats/base/file_io.h"
#include "formats/base/thread_pool.h"
#include "formats/digest/digest.h"
#include "formats/dtype/dtype.h"
#include "formats/io/source_window.h"
#include "formats/store/h5/h5_types.h"
#include "formats/store/h5/zstd_filter.h"
#include "formats/store/run_dir.h"

namespace ckpt::store {


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

uint64_t StoreReader::read_memory(int threads) const {
  const uint64_t shares = threads > 1 ? 2 * static_cast<uint64_t>(threads) - 1 : 1;
  for (const auto& rec : manifest_.pieces)
    if (rec.codec != Codec::kNone) return shares * kDecodeThreadBytes;
  return 0;
}

}  // namespace ckpt::store
