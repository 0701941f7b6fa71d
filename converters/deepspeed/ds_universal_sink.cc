#include "converters/deepspeed/ds_universal_sink.h"

#include <algorithm>

namespace ckpt {

namespace {

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// The root object and storage of one universal file (the arena must outlive TorchFileWriter::begin).
struct UniversalFile {
  torch::PyArena arena;
  const torch::PyObj* root = nullptr;
  std::vector<torch::TorchStorage> storages;
  explicit UniversalFile(const Shape& shape) : root(ds_universal_root(arena, shape)), storages{{"0", DType::kF32, numel_of(shape)}} {}
};

}  // namespace

const torch::PyObj* ds_universal_root(torch::PyArena& a, const Shape& shape) {
  torch::TensorRef ref;
  ref.storage = {"0", DType::kF32, numel_of(shape), "cpu"};
  ref.size.assign(shape.begin(), shape.end());
  ref.stride.assign(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) ref.stride[d - 1] = ref.stride[d] * shape[d];
  return a.dict({{a.str("cat_dim"), a.integer(0)}, {a.str("param"), a.tensor(std::move(ref))}});
}

DsUniversalSink::DsUniversalSink(std::vector<std::string> paths, torch::TorchWriteOptions opts)
    : paths_(std::move(paths)), opts_(std::move(opts)) {}

DsUniversalSink::~DsUniversalSink() { abort(); }

Status DsUniversalSink::begin(const std::vector<TensorMeta>& tensors, const std::vector<Piece>& pieces, const nlohmann::json&) {
  (void)tensors;
  if (pieces.size() != paths_.size())
    return Status::Internal("DsUniversalSink: " + std::to_string(paths_.size()) + " paths for " + std::to_string(pieces.size()) + " pieces");
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    if (p.dtype != DType::kF32 || p.region.is_flat())
      return Status::Internal("DsUniversalSink: piece " + std::to_string(i) + " of '" + p.tensor + "' is not a dense F32 box");
    shapes_.push_back(p.region.box.extent);
    numel_.push_back(p.region.numel());
  }
  done_.assign(pieces.size(), 0);
  open_.resize(pieces.size());
  committed_.assign(pieces.size(), false);
  return Status::Ok();
}

Status DsUniversalSink::open_piece(size_t piece) {
  if (open_[piece] || committed_[piece]) return Status::Ok();
  UniversalFile f(shapes_[piece]);
  auto w = std::make_unique<torch::TorchFileWriter>(paths_[piece], opts_);
  CKPT_RETURN_IF_ERROR(w->begin(f.root, f.storages));
  open_[piece] = std::move(w);
  return Status::Ok();
}

Status DsUniversalSink::finish_piece(size_t piece) {
  if (done_[piece] != numel_[piece] || committed_[piece]) return Status::Ok();
  CKPT_RETURN_IF_ERROR(open_piece(piece));  // an empty tensor gets its file here
  CKPT_RETURN_IF_ERROR(open_[piece]->commit());
  open_[piece].reset();
  committed_[piece] = true;
  return Status::Ok();
}

Result<uint64_t> DsUniversalSink::next_offset(size_t piece, int64_t count) {
  if (piece >= numel_.size() || count < 0 || count > numel_[piece] - done_[piece])
    return Status::Internal("DsUniversalSink::write of " + std::to_string(count) + " elements overruns piece " + std::to_string(piece));
  CKPT_RETURN_IF_ERROR(open_piece(piece));
  return static_cast<uint64_t>(done_[piece]) * 4;
}

Status DsUniversalSink::write(size_t piece, const void* data, int64_t count) {
  CKPT_ASSIGN_OR_RETURN(uint64_t off, next_offset(piece, count));
  CKPT_RETURN_IF_ERROR(open_[piece]->write_at(0, off, data, static_cast<uint64_t>(count) * 4));
  done_[piece] += count;
  return finish_piece(piece);
}

Status DsUniversalSink::write_from_file(size_t piece, const FileExtent& src, int64_t count) {
  CKPT_ASSIGN_OR_RETURN(uint64_t off, next_offset(piece, count));
  if (src.bytes != static_cast<uint64_t>(count) * 4)
    return Status::Internal("file extent of " + std::to_string(src.bytes) + " bytes for " + std::to_string(count) + " F32 elements");
  CKPT_RETURN_IF_ERROR(open_[piece]->write_from_file_at(0, off, src.fd, src.offset, src.bytes));
  done_[piece] += count;
  return finish_piece(piece);
}

Status DsUniversalSink::commit() {
  for (size_t i = 0; i < numel_.size(); ++i) {
    CKPT_RETURN_IF_ERROR(finish_piece(i));
    if (!committed_[i])
      return Status::Internal("DsUniversalSink: piece " + std::to_string(i) + " has " + std::to_string(done_[i]) + " of " +
                              std::to_string(numel_[i]) + " elements at commit");
  }
  return Status::Ok();
}

void DsUniversalSink::abort() {
  for (auto& w : open_)
    if (w) w->abort(), w.reset();
}

Status write_ds_universal_zeros(const std::string& path, const Shape& shape, const torch::TorchWriteOptions& opts) {
  UniversalFile f(shape);
  torch::TorchFileWriter w(path, opts);
  CKPT_RETURN_IF_ERROR(w.begin(f.root, f.storages));
  static const std::vector<char> zeros(1 << 20, 0);
  uint64_t left = static_cast<uint64_t>(f.storages[0].numel) * 4;
  while (left > 0) {
    const uint64_t n = std::min<uint64_t>(left, zeros.size());
    CKPT_RETURN_IF_ERROR(w.write(0, zeros.data(), n));
    left -= n;
  }
  return w.commit();
}

}  // namespace ckpt
