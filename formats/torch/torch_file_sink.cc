#include "formats/torch/torch_file_sink.h"

#include <algorithm>

namespace ckpt::torch {

TorchFileSink::TorchFileSink(std::string path, const PyObj* root, std::vector<TorchStorage> storages,
                             std::vector<TorchSinkSlot> slots, TorchWriteOptions opts)
    : writer_(std::move(path), std::move(opts)), root_(root), storages_(std::move(storages)), slots_(std::move(slots)) {}

Status TorchFileSink::begin(const std::vector<TensorMeta>& tensors, const std::vector<Piece>& pieces, const nlohmann::json&) {
  (void)tensors;
  if (pieces.size() != slots_.size())
    return Status::Internal("TorchFileSink: " + std::to_string(slots_.size()) + " slots for " + std::to_string(pieces.size()) + " pieces");
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    const TorchSinkSlot& s = slots_[i];
    if (s.storage >= storages_.size())
      return Status::Internal("TorchFileSink: piece " + std::to_string(i) + " names storage " + std::to_string(s.storage));
    const TorchStorage& st = storages_[s.storage];
    int64_t n = p.region.numel();
    if (p.dtype != st.dtype || s.first_element < 0 || s.first_element > st.numel || n > st.numel - s.first_element)
      return Status::Error("TorchWriteInvalid", "piece " + std::to_string(i) + " of '" + p.tensor + "' (" + std::string(dtype_name(p.dtype)) +
                                                    ", " + std::to_string(n) + " elements at " + std::to_string(s.first_element) +
                                                    ") does not fit storage '" + st.key + "' (" + std::string(dtype_name(st.dtype)) + " x " +
                                                    std::to_string(st.numel) + ")").with_tensor(p.tensor).with_file(writer_.path());
    numel_.push_back(n);
    elem_.push_back(dtype_size(p.dtype));
  }
  done_.assign(pieces.size(), 0);
  return writer_.begin(root_, storages_);
}

Result<uint64_t> TorchFileSink::next_offset(size_t piece, int64_t count) {
  if (piece >= slots_.size() || count < 0 || count > numel_[piece] - done_[piece])
    return Status::Internal("TorchFileSink::write of " + std::to_string(count) + " elements overruns piece " + std::to_string(piece));
  return static_cast<uint64_t>(slots_[piece].first_element + done_[piece]) * elem_[piece];
}

Status TorchFileSink::write(size_t piece, const void* data, int64_t count) {
  CKPT_ASSIGN_OR_RETURN(uint64_t off, next_offset(piece, count));
  CKPT_RETURN_IF_ERROR(writer_.write_at(slots_[piece].storage, off, data, static_cast<uint64_t>(count) * elem_[piece]));
  done_[piece] += count;
  return Status::Ok();
}

Status TorchFileSink::write_from_file(size_t piece, const FileExtent& src, int64_t count) {
  CKPT_ASSIGN_OR_RETURN(uint64_t off, next_offset(piece, count));
  if (src.bytes != static_cast<uint64_t>(count) * elem_[piece])
    return Status::Internal("file extent of " + std::to_string(src.bytes) + " bytes for " + std::to_string(count) + " elements");
  CKPT_RETURN_IF_ERROR(writer_.write_from_file_at(slots_[piece].storage, off, src.fd, src.offset, src.bytes));
  done_[piece] += count;
  return Status::Ok();
}

std::vector<size_t> TorchFileSink::write_order() const {
  std::vector<size_t> order(slots_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  const TorchZipWriter* z = writer_.zip();
  if (!z) return order;
  auto at = [&](size_t i) { return z->storage_offset(slots_[i].storage) + static_cast<uint64_t>(slots_[i].first_element) * elem_[i]; };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return at(a) < at(b); });
  return order;
}

Status TorchFileSink::commit() { return writer_.commit(); }

}  // namespace ckpt::torch
