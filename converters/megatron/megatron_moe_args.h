// Megatron-LM's mixture-of-experts args (docs/MOE.md step 3) both ways: which HF family a
// Megatron-Core MoE model is, its experts and its expert parallel layout. Megatron-Core's routing
// matches an HF family's only in these forms, so only they are read (others UnsupportedModel):
//   shared expert with its sigmoid gate (moe_shared_expert_gate)  -> qwen2_moe
//       (norm_topk_prob = !moe_router_pre_softmax; dense layers from moe_layer_freq as mlp_only_layers)
//   no shared expert, every layer MoE, top-k softmax renormalised  -> mixtral
// Refused by name: sigmoid scores / expert_bias (DeepSeek-V3's routing needs MLA), a top-k scaling
// factor, group-limited routing, a shared expert without a gate, dense layers without a shared expert.
// Pure functions; thread safe.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "converters/model/llama_config.h"
#include "formats/tensor/tensor_io.h"
#include "reshard/layout/layout.h"

namespace ckpt {

// True when the args describe an MoE model (num_experts set).
bool megatron_args_moe(const nlohmann::json& args);

// Sets the config's family and its HF MoE keys (in config.extra; LlamaConfig::from_json of
// config.to_json() parses them) and the layout's ep, etp and the least dp they need
// (ep * etp / gcd(tp, ep * etp)). Errors name `args_file` and the key: BadMegatronArgs,
// UnsupportedModel.
Status megatron_moe_from_args(const nlohmann::json& args, const std::string& args_file, LlamaConfig& config,
                              Layout& layout);

// The MoE args of an export of `config` in `layout` (num_experts, moe_router_topk,
// moe_ffn_hidden_size, moe_layer_freq as a list, shared expert, router, expert_model_parallel_size,
// expert_tensor_parallel_size, ...), added to `args`; nothing for a dense config.
void megatron_moe_args(const LlamaConfig& config, const Layout& layout, nlohmann::json& args);

// The layout of an export-megatron: tp, pp, the stage split; for an MoE config ep and etp (0: tp)
// and the least dp holding them. ep / etp for a dense config: LayoutRefused. Model checks
// (LlamaShardingRules::check_layout) done.
Result<Layout> megatron_export_layout(const LlamaConfig& config, int tp, int pp, int ep, int etp,
                                      const std::vector<int>& layers_per_stage);

// What an MoE export-megatron writes (UnsupportedModel otherwise): Mixtral or Qwen2-MoE with its
// gated shared expert, no virtual pipeline (`vpp` 1), no --dist-opt, no optimizer state in `tensors`.
Status megatron_moe_export_check(const LlamaConfig& config, int vpp, bool dist_opt, const std::vector<TensorMeta>& tensors);

}  // namespace ckpt
