// Sharding of quantized weights (docs/QUANTIZATION.md "Resharding"): a ShardingRules wrapper that
// keeps a quantized weight and its scales together. The payload is placed by the model's rules
// (it has the weight's shape); its scales get, for every TP rank, the box of the blocks that
// rank's payload box covers, so a rank holds exactly its blocks' scales. A payload box that starts
// or ends inside a block along a blocked dimension (not at 0, the tensor's end or a multiple of
// the block size) would share a block's scale between ranks: QuantSplitBlock, naming the tensor,
// the rank's box and the block size. Per-tensor scales and input scales are replicated; per-row
// scales follow the payload's rows. MXFP4 blocks and scales follow the box of their logical tensor
// (gpt-oss's experts: in the model's orientation, QuantTensor::transposed) when its range along
// the packed dimension is whole 32-value blocks; the leading (expert) dimensions split freely.
// Model knowledge stays in the wrapped rules; the engine only sees boxes. Thread safe (const).
#pragma once

#include <map>

#include "converters/quant/quant_scheme.h"
#include "reshard/layout/sharding.h"

namespace ckpt {

class QuantShardingRules : public ShardingRules {
 public:
  // `inner` must outlive this object.
  QuantShardingRules(const ShardingRules& inner, QuantScheme scheme);
  Status check_layout(const Layout& layout) const override { return inner_.check_layout(layout); }
  Result<TensorPlacement> place(const TensorMeta& tensor, const Layout& layout) const override;

 private:
  const ShardingRules& inner_;
  QuantScheme scheme_;
  std::map<std::string, const QuantTensor*> by_payload_, by_scale_, by_input_;
};

// The box of the scales covering payload box `b` of quantized tensor `q`, or QuantSplitBlock when
// `b` cuts a block.
Result<Box> scale_box_of(const QuantTensor& q, const Box& b);

}  // namespace ckpt
