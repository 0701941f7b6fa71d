// CheckedReads: a TensorSource that checks, before the first read of each piece, the stored units
// that hold it (TensorSource::check_piece: a native piece's digest, a torch zip entry's CRC-32),
// so that no byte leaves a reader that reads only some pieces (ckpt.open(...).read in Python)
// without the check its format offers. Everything else passes through to the wrapped source.
// Thread safety: as the wrapped source (check_piece is thread-safe where read() is).
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "formats/tensor/tensor_io.h"

namespace ckpt {

class CheckedReads final : public TensorSource {
 public:
  explicit CheckedReads(std::unique_ptr<TensorSource> inner) : inner_(std::move(inner)) {}
  const std::vector<TensorMeta>& tensors() const override { return inner_->tensors(); }
  const std::vector<Piece>& pieces() const override { return inner_->pieces(); }
  Status read(size_t piece, const Box& sub, void* dst) override {
    CKPT_RETURN_IF_ERROR(inner_->check_piece(piece));
    return inner_->read(piece, sub, dst);
  }
  // No file ranges: a sink copying file to file would pass the check by.
  const nlohmann::json& metadata() const override { return inner_->metadata(); }
  std::string describe() const override { return inner_->describe(); }
  IntegrityInfo integrity() const override { return inner_->integrity(); }
  CheckReport check(const CheckOptions& o) override { return inner_->check(o); }
  Status check_piece(size_t piece) override { return inner_->check_piece(piece); }
  void set_read_threads(int threads) override { inner_->set_read_threads(threads); }
  std::optional<RangeCheck> range_check(size_t piece) override { return inner_->range_check(piece); }
  uint64_t read_memory(int threads) const override { return inner_->read_memory(threads); }

 private:
  std::unique_ptr<TensorSource> inner_;
};

}  // namespace ckpt
