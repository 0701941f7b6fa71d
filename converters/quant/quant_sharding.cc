#include "converters/quant/quant_sharding.h"

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
  if (q.kind == QuantKind::kMxfp4)
    return Status::Error("QuantUnsupported", "quantized tensor '" + q.name + "': MXFP4 expert tensors are not placed by the " +
                                                 "LLaMA rules; reshard them through a dequantized export").with_tensor(q.name);
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
