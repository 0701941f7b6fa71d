#include "reshard/memory_io.h"

#include <cstring>

namespace ckpt {

namespace {
int64_t flat_index(const Box& box, const Shape& point) {
  int64_t idx = 0;
  for (size_t d = 0; d < box.ndim(); ++d) idx = idx * box.extent[d] + (point[d] - box.offset[d]);
  return idx;
}
}  // namespace

Status MemorySource::read(size_t piece, const Box& sub, void* dst) {
  ++reads_;
  if (piece >= c_.pieces.size())
    return Status::Internal("piece " + std::to_string(piece) + " of " + std::to_string(c_.pieces.size()));
  const Piece& p = c_.pieces[piece];
  const size_t es = dtype_size(p.dtype);
  const auto& buf = c_.data[piece];
  if (buf.size() != static_cast<size_t>(p.region.numel()) * es)
    return Status::Error("PieceSize", name_ + ": piece " + std::to_string(piece) + " holds " +
                                               std::to_string(buf.size()) + " bytes, expected " +
                                               std::to_string(p.region.numel() * static_cast<int64_t>(es)))
        .with_tensor(p.tensor);
  if (!p.region.is_flat()) {
    if (!p.region.box.contains(sub))
      return Status::Internal("read of " + sub.to_string() + " outside piece " + p.region.to_string());
    copy_box(buf.data(), p.region.box, dst, sub, sub, es);
    return Status::Ok();
  }
  for (const Box& b : p.region.boxes()) {
    if (!b.contains(sub)) continue;
    const int64_t start = flat_index(p.region.box, b.offset) - p.region.flat_begin;
    copy_box(buf.data() + static_cast<size_t>(start) * es, b, dst, sub, sub, es);
    return Status::Ok();
  }
  return Status::Internal("read of " + sub.to_string() + " not inside one box of flat piece " + p.region.to_string());
}

Status MemorySink::begin(const std::vector<TensorMeta>& tensors, const std::vector<Piece>& pieces,
                         const nlohmann::json& metadata) {
  if (began_) return Status::Internal("MemorySink::begin called twice");
  c_.tensors = tensors;
  c_.pieces = pieces;
  c_.metadata = metadata;
  c_.data.assign(pieces.size(), {});
  written_.assign(pieces.size(), 0);
  for (size_t i = 0; i < pieces.size(); ++i)
    c_.data[i].reserve(static_cast<size_t>(pieces[i].region.numel()) * dtype_size(pieces[i].dtype));
  began_ = true;
  return Status::Ok();
}

Status MemorySink::write(size_t piece, const void* data, int64_t count) {
  if (!began_ || committed_ || aborted_) return Status::Internal("MemorySink::write outside begin..commit");
  if (piece >= c_.pieces.size()) return Status::Internal("write to unknown piece " + std::to_string(piece));
  const Piece& p = c_.pieces[piece];
  if (count < 0 || written_[piece] + count > p.region.numel())
    return Status::Internal("write of " + std::to_string(count) + " elements past the end of piece " +
                            std::to_string(piece) + " (" + p.tensor + ")");
  const size_t es = dtype_size(p.dtype);
  const auto* b = static_cast<const uint8_t*>(data);
  c_.data[piece].insert(c_.data[piece].end(), b, b + static_cast<size_t>(count) * es);
  written_[piece] += count;
  return Status::Ok();
}

Status MemorySink::commit() {
  if (!began_ || aborted_) return Status::Internal("MemorySink::commit without begin or after abort");
  for (size_t i = 0; i < c_.pieces.size(); ++i)
    if (written_[i] != c_.pieces[i].region.numel())
      return Status::Internal("piece " + std::to_string(i) + " (" + c_.pieces[i].tensor + ") got " +
                              std::to_string(written_[i]) + " of " + std::to_string(c_.pieces[i].region.numel()) +
                              " elements");
  committed_ = true;
  return Status::Ok();
}

void MemorySink::abort() { aborted_ = true; }

}  // namespace ckpt
