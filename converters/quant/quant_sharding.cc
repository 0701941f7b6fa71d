#include "converters/quant/quant_sharding.h"

#include <utility>

namespace ckpt {

namespace {

Status split_block(const QuantTensor& q, const Box& b, size_t dim, int64_t block) {
  return Status::Error("QuantSplitBlock", "quantized tensor '" + q.name + "': a rank's box " + b.to_string() + " of " +
                                              shape_to_string(q.shape) + " cuts a " + std::to_string(q.block_rows) + "x" +
                                              std::to_string(q.block_cols) + " block along dimension " + std::to_string(dim) +
                                              " (block " + std::to_string(block) + "): its scale would belong to two ranks; "
                                              "choose a layout that splits on block boundaries")
      .with_tensor(q.name);
}

// MXFP4 (payload [.., out, G, 16], scales [.., out, G]): the logical tensor `q.name` is placed by
// the model's rules (gpt-oss's experts in the model's orientation, QuantTensor::transposed); each of
// its boxes becomes the stored box (its last two dims swapped back when transposed), whose `in`
// range must start and end on a 32-value block, then the payload / scale box of those blocks.
Result<TensorPlacement> place_mxfp4(const ShardingRules& inner, const QuantTensor& q, bool scale, const Layout& layout) {
  CKPT_ASSIGN_OR_RETURN(TensorPlacement p, inner.place(TensorMeta{q.name, DType::kBF16, q.shape}, layout));
  for (Box& b : p.tp_boxes) {
    Box s = b;
    const size_t nd = s.offset.size();
    if (q.transposed) {
      std::swap(s.offset[nd - 1], s.offset[nd - 2]);
      std::swap(s.extent[nd - 1], s.extent[nd - 2]);
    }
    const int64_t lo = s.offset[nd - 1], hi = lo + s.extent[nd - 1];
    if (s.extent[nd - 1] > 0 && (lo % 32 != 0 || hi % 32 != 0)) return split_block(q, b, q.transposed ? nd - 2 : nd - 1, 32);
    s.offset[nd - 1] = lo / 32;
    s.extent[nd - 1] = s.extent[nd - 1] / 32;
    if (!scale) {
      s.offset.push_back(0);
      s.extent.push_back(16);
    }
    b = std::move(s);
  }
  return p;
}

}  // namespace

Result<Box> scale_box_of(const QuantTensor& q, const Box& b) {
  if (q.kind == QuantKind::kFp8Tensor && !q.per_row) return Box::whole(q.scale_shape);
  Box s = b;
  const size_t nd = b.extent.size();
  if (q.kind == QuantKind::kFp8Tensor) {  // per row: [R] or [R, 1]
    s = Box::whole(q.scale_shape);
    s.offset[0] = b.offset[0];
    s.extent[0] = b.extent[0];  // a row's scale holds for any of its columns: column splits are free
    return s;
  }
  // fp8-block: the last two dims in blocks; mxfp4 (payload [.., G, 16] bytes): the scales are
  // [.., G], one per payload row, so only the byte dimension must be whole.
  if (q.kind == QuantKind::kMxfp4) {
    if (b.offset[nd - 1] != 0 || b.extent[nd - 1] != 16) return split_block(q, b, nd - 1, 32);
    s.offset.pop_back();
    s.extent.pop_back();
    return s;
  }
  const int64_t blk[2] = {q.block_rows, q.block_cols};
  for (size_t k = 0; k < 2; ++k) {
    const size_t d = nd - 2 + k;
    const int64_t lo = b.offset[d], hi = b.offset[d] + b.extent[d];
    if (b.extent[d] == 0) {
      s.offset[d] = lo / blk[k];
      s.extent[d] = 0;
      continue;
    }
    if (lo % blk[k] != 0) return split_block(q, b, d, blk[k]);
    if (hi % blk[k] != 0 && hi != q.shape[d]) return split_block(q, b, d, blk[k]);
    s.offset[d] = lo / blk[k];
    s.extent[d] = (hi + blk[k] - 1) / blk[k] - s.offset[d];
  }
  return s;
}

QuantShardingRules::QuantShardingRules(const ShardingRules& inner, QuantScheme scheme) : inner_(inner), scheme_(std::move(scheme)) {
  for (const auto& q : scheme_.tensors) {
    by_payload_[q.payload] = &q;
    by_scale_[q.scale] = &q;
    if (!q.input_scale.empty()) by_input_[q.input_scale] = &q;
  }
}

Result<TensorPlacement> QuantShardingRules::place(const TensorMeta& tensor, const Layout& layout) const {
  auto pit = by_payload_.find(tensor.name);
  auto sit = by_scale_.find(tensor.name);
  auto iit = by_input_.find(tensor.name);
  if (pit == by_payload_.end() && sit == by_scale_.end() && iit == by_input_.end()) return inner_.place(tensor, layout);
  const QuantTensor& q = *(pit != by_payload_.end() ? pit->second : sit != by_scale_.end() ? sit->second : iit->second);
  if (q.kind == QuantKind::kMxfp4) return place_mxfp4(inner_, q, sit != by_scale_.end(), layout);
  // The weight's placement: the model's rules see the payload as the weight it stands for.
  CKPT_ASSIGN_OR_RETURN(TensorPlacement p, inner_.place(TensorMeta{q.payload, tensor.dtype, q.shape}, layout));
  if (iit != by_input_.end()) {
    for (Box& b : p.tp_boxes) b = Box::whole(tensor.shape);
    return p;
  }
  std::vector<Box> scale_boxes;
  for (const Box& b : p.tp_boxes) {
    CKPT_ASSIGN_OR_RETURN(Box s, scale_box_of(q, b));
    scale_boxes.push_back(std::move(s));
  }
  if (sit != by_scale_.end()) p.tp_boxes = std::move(scale_boxes);
  return p;
}

}  // namespace ckpt
