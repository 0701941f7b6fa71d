#include "converters/paddle/relabeled_source.h"

namespace ckpt {

RelabeledSource::RelabeledSource(std::unique_ptr<TensorSource> inner, DType from, DType to, nlohmann::json metadata)
    : inner_(std::move(inner)), metas_(inner_->tensors()), pieces_(inner_->pieces()), meta_(std::move(metadata)) {
  if (from == to || dtype_size(from) != dtype_size(to)) return;
  for (TensorMeta& m : metas_)
    if (m.dtype == from) {
      m.dtype = to;
      ++relabeled_;
    }
  for (Piece& p : pieces_)
    if (p.dtype == from) p.dtype = to;
}

}  // namespace ckpt
