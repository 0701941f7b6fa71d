// A source whose tensors of one dtype are presented as another of the same size (the same bytes):
// PaddleNLP stores bf16 as numpy uint16 and says so only in config.json ("dtype": "bfloat16"), so
// its U16 is read as BF16 and BF16 is written as U16. Everything else is forwarded (reads, file
// extents, checks, storage); metadata is the wrapper's own.
// Thread safety: as the inner source.
#pragma once

#include <memory>
#include <vector>

#include "formats/tensor/tensor_io.h"

namespace ckpt {

class RelabeledSource final : public TensorSource {
 public:
  // Tensors of dtype `from` become `to` (same size; from == to: none); `metadata` replaces the inner source's.
  RelabeledSource(std::unique_ptr<TensorSource> inner, DType from, DType to, nlohmann::json metadata);

  const std::vector<TensorMeta>& tensors() const override { return metas_; }
  const std::vector<Piece>& pieces() const override { return pieces_; }
  Status read(size_t piece, const Box& sub, void* dst) override { return inner_->read(piece, sub, dst); }
  std::optional<FileExtent> file_extent(size_t piece, const Box& sub) override { return inner_->file_extent(piece, sub); }
  const nlohmann::json& metadata() const override { return meta_; }
  std::string describe() const override { return inner_->describe(); }
  IntegrityInfo integrity() const override { return inner_->integrity(); }
  CheckReport check(const CheckOptions& o) override { return check_of_inner(*inner_, o, true); }
  Status check_piece(size_t piece) override { return inner_->check_piece(piece); }
  std::optional<RangeCheck> range_check(size_t piece) override { return inner_->range_check(piece); }
  PieceStorage piece_storage(size_t piece) override { return inner_->piece_storage(piece); }
  void set_read_threads(int threads) override { inner_->set_read_threads(threads); }
  uint64_t read_memory(int threads) const override { return inner_->read_memory(threads); }
  // How many tensors were relabeled.
  size_t relabeled() const { return relabeled_; }

 private:
  std::unique_ptr<TensorSource> inner_;
  std::vector<TensorMeta> metas_;
  std::vector<Piece> pieces_;
  nlohmann::json meta_;
  size_t relabeled_ = 0;
};

}  // namespace ckpt
