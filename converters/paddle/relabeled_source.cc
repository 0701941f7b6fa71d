#include "converters/paddle/relabeled_source.h"

namespace ckpt {

RelabeledSource::RelabeledSource(std::unique_ptr<TensorSource> inner, bool u16_as_bf16, nlohmann::json metadata)
    : inner_(std::move(inner)), metas_(inner_->tensors()), pieces_(inner_->pieces()), meta_(std::move(metadata)) {
  if (!u16_as_bf16) return;
  for (TensorMeta& m : metas_)
    if (m.dtype == DType::kU16) {
      m.dtype = DType::kBF16;
      ++relabeled_;
    }
  for (Piece& p : pieces_)
    if (p.dtype == DType::kU16) p.dtype = DType::kBF16;
}

}  // namespace ckpt
