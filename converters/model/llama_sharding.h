// LlamaShardingRules: where every canonical LLaMA tensor (HF names, optimizer.* included) lives
// under a Layout: pipeline stages and the box of each TP rank. Rules are in docs/RESHARD.md.
// Immutable after construction; thread safe (const methods only).
#pragma once

#include <map>
#include <string>

#include "converters/model/llama_config.h"
#include "reshard/layout/sharding.h"

namespace ckpt {

class LlamaShardingRules : public ShardingRules {
 public:
  explicit LlamaShardingRules(LlamaConfig config);

  // Refuses (kInvalidArgument, code "LayoutRefused") layouts the model cannot take: layer count
  // != num_hidden_layers, pp > layers, an empty or out-of-order stage, tp not dividing heads,
  // KV heads or intermediate_size (tp > K is accepted when K divides tp: KV replicated).
  Status check_layout(const Layout& layout) const override;

  // Placement of a model tensor or of `optimizer.{exp_avg,exp_avg_sq,fp32_param}.<param>`.
  // Unknown names and shapes that disagree with the config are errors naming the tensor.
  Result<TensorPlacement> place(const TensorMeta& tensor, const Layout& layout) const override;

  const LlamaConfig& config() const { return config_; }

  // How many consecutive TP ranks share one KV head (1 when tp divides K).
  static int64_t kv_replication(int64_t num_kv_heads, int tp);

 private:
  LlamaConfig config_;
  std::map<std::string, Shape> shapes_;  // canonical model tensor -> HF shape
};

}  // namespace ckpt
