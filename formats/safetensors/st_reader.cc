#include "formats/safetensors/st_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "formats/base/checked.h"

namespace ckpt::safetensors {

namespace {
constexpr uint64_t kDirectRunBytes = 64 << 10;   // runs at least this long are preads into dst
constexpr uint64_t kBounceBytes = 4 << 20;       // bounce buffer for short runs
}  // namespace

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f->fd_ < 0) {
    int e = errno;
    if (e == ENOENT) return Status::NotFound("no such safetensors file '" + path + "'");
    return Status::FromErrno("cannot open", path, e);
  }
  struct stat st;
  if (::fstat(f->fd_, &st) != 0) return Status::FromErrno("cannot stat", path, errno);
  if (!S_ISREG(st.st_mode)) return Status::InvalidArgument("'" + path + "' is not a regular file");
  f->file_size_ = static_cast<uint64_t>(st.st_size);
  uint8_t first8[8] = {0};
  if (f->file_size_ >= 8) CKPT_RETURN_IF_ERROR(pread_full(f->fd_, first8, 8, 0, path));
  auto n = parse_header_size(first8, f->file_size_);
  if (!n.ok()) return n.take_status().with_file(path);
  std::string js(*n, '\0');
  CKPT_RETURN_IF_ERROR(pread_full(f->fd_, js.data(), *n, 8, path));
  auto h = parse_header(js, f->file_size_);
  if (!h.ok()) return h.take_status().with_file(path);
  f->header_ = std::move(*h);
  f->metas_.reserve(f->header_.tensors.size());
  f->pieces_.reserve(f->header_.tensors.size());
  for (const auto& t : f->header_.tensors) {
    f->metas_.push_back(TensorMeta{t.name, t.dtype, t.shape});
    f->pieces_.push_back(Piece{t.name, Region{Box::whole(t.shape)}, t.dtype});
  }
  f->meta_json_ = nlohmann::json::object();
  if (f->header_.has_metadata) f->meta_json_["safetensors_metadata"] = f->header_.metadata;
  return f;
}

Status SafetensorsFile::read_data(uint64_t begin, void* dst, uint64_t n) const {
  auto end = checked_add(begin, n);
  if (!end || *end > header_.data_size)
    return Status::Error("SliceOutOfRange",
                         "byte range " + std::to_string(begin) + "+" + std::to_string(n) + " lies outside the data buffer (" +
                             std::to_string(header_.data_size) + " bytes) of '" + path_ + "'");
  return pread_full(fd_, dst, n, header_.data_start() + begin, path_);
}

std::optional<FileExtent> SafetensorsFile::file_extent(size_t piece, const Box& sub) {
  if (piece >= header_.tensors.size()) return std::nullopt;
  const TensorEntry& t = header_.tensors[piece];
  const std::optional<int64_t> start = row_major_run_start(Box::whole(t.shape), sub);
  if (!start) return std::nullopt;
  // Inside the tensor's bytes, which open() checked to lie inside the file.
  const uint64_t es = dtype_size(t.dtype);
  return FileExtent{fd_, header_.data_start() + t.begin + static_cast<uint64_t>(*start) * es, static_cast<uint64_t>(sub.numel()) * es};
}

Status SafetensorsFile::read(size_t piece, const Box& sub, void* dst) {
  if (piece >= header_.tensors.size())
    return Status::InvalidArgument("piece " + std::to_string(piece) + " out of range (" + std::to_string(header_.tensors.size()) +
                                   " tensors) in '" + path_ + "'");
  const TensorEntry& t = header_.tensors[piece];
  const size_t nd = t.shape.size();
  if (sub.extent.size() > nd || sub.offset.size() > nd)
    return Status::Error("TooManySlices",
                         "sub-box " + sub.to_string() + " has more dimensions than tensor '" + t.name + "' " + shape_to_string(t.shape))
        .with_file(path_);
  Status vs = validate_box(sub, t.shape);
  if (!vs.ok())
    return Status::Error("SliceOutOfRange",
                         "sub-box " + sub.to_string() + " of tensor '" + t.name + "' " + shape_to_string(t.shape) + ": " + vs.message())
        .with_file(path_);
  const uint64_t es = dtype_size(t.dtype);
  if (sub.numel() == 0) return Status::Ok();
  if (nd == 0) return read_data(t.begin, dst, es);
  // Row-major strides of the stored tensor, in elements.
  std::vector<uint64_t> stride(nd, 1);
  for (size_t d = nd - 1; d > 0; --d) stride[d - 1] = stride[d] * static_cast<uint64_t>(t.shape[d]);
  // k: the last dimension that is not taken whole; everything after k is full, so one run
  // (contiguous in the file) is sub.extent[k] * stride[k] elements.
  size_t k = 0;
  for (size_t d = nd; d-- > 0;) {
    if (sub.offset[d] != 0 || sub.extent[d] != t.shape[d]) { k = d; break; }
  }
  const uint64_t run_bytes = static_cast<uint64_t>(sub.extent[k]) * stride[k] * es;
  uint64_t nruns = 1;
  for (size_t d = 0; d < k; ++d) nruns *= static_cast<uint64_t>(sub.extent[d]);
  const uint64_t row_bytes = stride[0] * es;
  auto* out = static_cast<char*>(dst);
  if (nruns == 1 || run_bytes >= kDirectRunBytes || row_bytes > 4 * kBounceBytes) {
    std::vector<int64_t> idx(k, 0);
    for (uint64_t r = 0; r < nruns; ++r) {
      uint64_t elem = static_cast<uint64_t>(sub.offset[k]) * stride[k];
      for (size_t d = 0; d < k; ++d) elem += static_cast<uint64_t>(sub.offset[d] + idx[d]) * stride[d];
      CKPT_RETURN_IF_ERROR(read_data(t.begin + elem * es, out, run_bytes));
      out += run_bytes;
      for (size_t d = k; d-- > 0;) {
        if (++idx[d] < sub.extent[d]) break;
        idx[d] = 0;
      }
    }
    return Status::Ok();
  }
  // Short runs: read whole rows of dim 0 through a bounce buffer and copy the sub-box out.
  const int64_t rows_per_chunk = static_cast<int64_t>(std::max<uint64_t>(1, kBounceBytes / row_bytes));
  std::vector<char> bounce(static_cast<size_t>(std::min<int64_t>(rows_per_chunk, sub.extent[0])) * row_bytes);
  for (int64_t r = 0; r < sub.extent[0]; r += rows_per_chunk) {
    const int64_t cnt = std::min<int64_t>(rows_per_chunk, sub.extent[0] - r);
    const int64_t row0 = sub.offset[0] + r;
    CKPT_RETURN_IF_ERROR(read_data(t.begin + static_cast<uint64_t>(row0) * row_bytes, bounce.data(), static_cast<uint64_t>(cnt) * row_bytes));
    Box src_box = Box::whole(t.shape);
    src_box.offset[0] = row0;
    src_box.extent[0] = cnt;
    Box region = sub;
    region.offset[0] = row0;
    region.extent[0] = cnt;
    copy_box(bounce.data(), src_box, dst, sub, region, es);
  }
  return Status::Ok();
}

}  // namespace ckpt::safetensors
