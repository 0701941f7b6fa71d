#include "converters/quant/requantize.h"

#include <numeric>

#include "converters/quant/dequant_view.h"
#include "converters/quant/quantize_view.h"

namespace ckpt {

Result<std::unique_ptr<Requantized>> requantize_for_layout(TensorSource& src, const QuantScheme& scheme, const ShardingRules& model,
                                                           const Layout& layout) {
  int64_t bm = 0, bn = 0;
  bool cut = false;
  for (const auto& q : scheme.tensors) {
    if (q.kind != QuantKind::kFp8Block)
      return Status::Error("QuantUnsupported", "--requantize re-blocks fp8-block weights; '" + q.name + "' is " + quant_kind_name(q.kind))
          .with_tensor(q.name);
    if (bm == 0) bm = q.block_rows, bn = q.block_cols;
    CKPT_ASSIGN_OR_RETURN(TensorPlacement p, model.place(TensorMeta{q.payload, q.payload_dtype, q.shape}, layout));
    const size_t nd = q.shape.size();
    for (const Box& b : p.tp_boxes)
      for (size_t k = 0; k < 2; ++k) {
        const size_t d = nd - 2 + k;
        int64_t& g = k == 0 ? bm : bn;
        const int64_t blk = k == 0 ? q.block_rows : q.block_cols;
        const int64_t ends[2] = {b.offset[d], b.offset[d] + b.extent[d] == q.shape[d] ? 0 : b.offset[d] + b.extent[d]};
        for (int64_t e : ends) {
          if (e % blk != 0) cut = true;
          g = std::gcd(g, e);
        }
      }
  }
  if (!cut) return std::unique_ptr<Requantized>();
  for (const auto& q : scheme.tensors)
    if (q.shape[q.shape.size() - 2] % bm != 0 || q.shape.back() % bn != 0)
      return Status::Error("QuantUnsupported", "--requantize: '" + q.name + "' " + shape_to_string(q.shape) + " does not divide by the new block " +
                                                   std::to_string(bm) + "x" + std::to_string(bn))
          .with_tensor(q.name);
  auto out = std::make_unique<Requantized>();
  out->tracker = std::make_unique<ExactnessTracker>();
  CKPT_ASSIGN_OR_RETURN(auto deq, dequant_view(src, nullptr, scheme, DType::kF32));
  QuantizeRequest req;
  req.block_rows = bm;
  req.block_cols = bn;
  req.tracker = out->tracker.get();
  req.step = "requantize fp8-block " + std::to_string(scheme.tensors[0].block_rows) + "x" + std::to_string(scheme.tensors[0].block_cols) +
             " -> " + std::to_string(bm) + "x" + std::to_string(bn);
  TensorSource& inner = *deq;
  CKPT_ASSIGN_OR_RETURN(out->view, quantize_view(inner, std::move(deq), req));
  CKPT_ASSIGN_OR_RETURN(out->scheme, find_quantized(out->view->tensors(), out->view->metadata()));
  return out;
}

}  // namespace ckpt
