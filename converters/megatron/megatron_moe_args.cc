#include "converters/megatron/megatron_moe_args.h"

#include "converters/model/llama_sharding.h"

#include <algorithm>
#include <numeric>
#include <vector>

namespace ckpt {

namespace {

Status moe_bad_args(const std::string& file, const std::string& msg) {
  return Status::Error("BadMegatronArgs", "'" + file + "': " + msg).with_file(file);
}

Status moe_unsupported(const std::string& file, const std::string& msg) {
  return Status::Error("UnsupportedModel", "'" + file + "': Megatron-Core MoE " + msg +
                                               " (ckpt reads Mixtral's and Qwen2-MoE's routing; docs/MOE.md)")
      .with_file(file);
}

// An integer arg in [lo, hi]; `dflt` when absent or None.
Result<int64_t> moe_int(const nlohmann::json& j, const std::string& file, const char* key, int64_t lo, int64_t hi,
                        int64_t dflt) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  if (!j[key].is_number_integer() || j[key].get<int64_t>() < lo || j[key].get<int64_t>() > hi)
    return moe_bad_args(file, std::string("key '") + key + "' = " + j[key].dump().substr(0, 64) + ", expected an integer in " +
                                  std::to_string(lo) + ".." + std::to_string(hi));
  return j[key].get<int64_t>();
}

Result<bool> moe_bool(const nlohmann::json& j, const std::string& file, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return false;
  if (!j[key].is_boolean()) return moe_bad_args(file, std::string("key '") + key + "' must be a boolean");
  return j[key].get<bool>();
}

// moe_layer_freq: an int f (layer i MoE when i % f == 0) or a list of 0/1 per layer.
Result<std::vector<bool>> moe_layers(const nlohmann::json& j, const std::string& file, int64_t layers) {
  std::vector<bool> moe(static_cast<size_t>(layers), true);
  if (!j.contains("moe_layer_freq") || j["moe_layer_freq"].is_null()) return moe;
  const auto& f = j["moe_layer_freq"];
  if (f.is_number_integer()) {
    CKPT_ASSIGN_OR_RETURN(const int64_t freq, moe_int(j, file, "moe_layer_freq", 1, layers, 1));
    for (int64_t i = 0; i < layers; ++i) moe[i] = i % freq == 0;
    return moe;
  }
  if (!f.is_array() || static_cast<int64_t>(f.size()) != layers)
    return moe_bad_args(file, "key 'moe_layer_freq' = " + f.dump().substr(0, 64) + ", expected an integer or a list of " +
                                  std::to_string(layers) + " entries 0 / 1");
  for (int64_t i = 0; i < layers; ++i) {
    if (!f[i].is_number_integer() || (f[i] != 0 && f[i] != 1))
      return moe_bad_args(file, "key 'moe_layer_freq' entry " + std::to_string(i) + " is " + f[i].dump().substr(0, 16) +
                                    ", expected 0 or 1");
    moe[i] = f[i] == 1;
  }
  return moe;
}

// The routing settings ckpt cannot map to an HF family.
Status check_routing(const nlohmann::json& j, const std::string& file) {
  if (j.contains("moe_router_score_function") && j["moe_router_score_function"].is_string() &&
      j["moe_router_score_function"] != "softmax")
    return moe_unsupported(file, "with moe_router_score_function " + j["moe_router_score_function"].dump());
  CKPT_ASSIGN_OR_RETURN(const bool bias, moe_bool(j, file, "moe_router_enable_expert_bias"));
  if (bias) return moe_unsupported(file, "with moe_router_enable_expert_bias (DeepSeek-V3's routing, which needs MLA)");
  if (j.contains("moe_router_topk_scaling_factor") && !j["moe_router_topk_scaling_factor"].is_null() &&
      j["moe_router_topk_scaling_factor"] != 1.0)
    return moe_unsupported(file, "with moe_router_topk_scaling_factor " + j["moe_router_topk_scaling_factor"].dump());
  for (const char* k : {"moe_router_num_groups", "moe_router_group_topk"})
    if (j.contains(k) && !j[k].is_null()) return moe_unsupported(file, std::string("with ") + k + " (group-limited routing)");
  return Status::Ok();
}

}  // namespace

bool megatron_args_moe(const nlohmann::json& j) {
  return j.is_object() && j.contains("num_experts") && !j["num_experts"].is_null();
}

Status megatron_moe_from_args(const nlohmann::json& j, const std::string& file, LlamaConfig& c, Layout& layout) {
  CKPT_RETURN_IF_ERROR(check_routing(j, file));
  CKPT_ASSIGN_OR_RETURN(const int64_t experts, moe_int(j, file, "num_experts", 1, kMaxExperts, 0));
  CKPT_ASSIGN_OR_RETURN(const int64_t topk, moe_int(j, file, "moe_router_topk", 1, experts, 2));
  CKPT_ASSIGN_OR_RETURN(const int64_t width, moe_int(j, file, "moe_ffn_hidden_size", 1, int64_t{1} << 20, c.intermediate_size));
  CKPT_ASSIGN_OR_RETURN(const int64_t shared, moe_int(j, file, "moe_shared_expert_intermediate_size", 1, int64_t{1} << 20, 0));
  CKPT_ASSIGN_OR_RETURN(const bool gate, moe_bool(j, file, "moe_shared_expert_gate"));
  CKPT_ASSIGN_OR_RETURN(const bool pre_softmax, moe_bool(j, file, "moe_router_pre_softmax"));
  CKPT_ASSIGN_OR_RETURN(const std::vector<bool> moe, moe_layers(j, file, c.num_hidden_layers));
  CKPT_ASSIGN_OR_RETURN(const int64_t ep, moe_int(j, file, "expert_model_parallel_size", 1, 1 << 16, 1));
  CKPT_ASSIGN_OR_RETURN(const int64_t etp, moe_int(j, file, "expert_tensor_parallel_size", 1, 1 << 16, layout.tp));
  std::vector<int64_t> dense;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    if (!moe[i]) dense.push_back(i);
  if (shared > 0 && !gate) return moe_unsupported(file, "with a shared expert without moe_shared_expert_gate");
  if (shared > 0) {
    c.family = ModelFamily::kQwen2Moe;
    c.extra["num_experts"] = experts;
    c.extra["moe_intermediate_size"] = width;
    c.extra["shared_expert_intermediate_size"] = shared;
    c.extra["decoder_sparse_step"] = 1;
    c.extra["mlp_only_layers"] = dense;
    c.extra["norm_topk_prob"] = !pre_softmax;
    c.extra["qkv_bias"] = c.attention_bias;  // Megatron's add_qkv_bias: q/k/v biases without o_proj's
    c.attention_bias = false;
  } else {
    if (!dense.empty()) return moe_unsupported(file, "with dense layers (moe_layer_freq) and no shared expert");
    if (pre_softmax) return moe_unsupported(file, "with moe_router_pre_softmax and no shared expert (Mixtral renormalises the top-k)");
    c.family = ModelFamily::kMixtral;
    c.extra["num_local_experts"] = experts;
    c.intermediate_size = width;
  }
  c.extra["num_experts_per_tok"] = topk;
  const int64_t g = std::gcd<int64_t>(layout.tp, ep * etp);
  layout.ep = static_cast<int>(ep);
  layout.etp = static_cast<int>(etp);
  layout.dp = static_cast<int>(ep * etp / g);
  return Status::Ok();
}

void megatron_moe_args(const LlamaConfig& c, const Layout& layout, nlohmann::json& j) {
  if (!c.moe) return;
  const MoeConfig& m = *c.moe;
  j["num_experts"] = m.num_experts;
  j["moe_router_topk"] = m.top_k;
  j["moe_ffn_hidden_size"] = m.expert_intermediate;
  std::vector<int> freq;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) freq.push_back(m.is_moe_layer(i) ? 1 : 0);
  j["moe_layer_freq"] = freq;
  j["moe_shared_expert_intermediate_size"] = m.shared_intermediate > 0 ? nlohmann::json(m.shared_intermediate) : nlohmann::json();
  j["moe_shared_expert_gate"] = m.shared_gate && m.shared_intermediate > 0;
  j["moe_router_pre_softmax"] = c.family != ModelFamily::kMixtral && !m.norm_topk_prob;
  j["moe_router_score_function"] = "softmax";
  j["moe_router_enable_expert_bias"] = false;
  j["moe_grouped_gemm"] = false;
  j["expert_model_parallel_size"] = layout.ep;
  j["expert_tensor_parallel_size"] = layout.expert_tp();
}

Result<Layout> megatron_export_layout(const LlamaConfig& c, int tp, int pp, int ep_in, int etp_in,
                                      const std::vector<int>& layers_per_stage) {
  const int ep = std::max(ep_in, 1), etp = etp_in > 0 ? etp_in : std::max(tp, 1);
  if (!c.moe && (ep_in != 1 || etp_in > 0))
    return Status::Error("LayoutRefused", "export-megatron --ep / --etp for a dense model (expert parallelism needs an MoE model)");
  const int dp = c.moe ? ep * etp / std::gcd(std::max(tp, 1), ep * etp) : 1;
  CKPT_ASSIGN_OR_RETURN(Layout layout, Layout::make(tp, pp, dp, 0, static_cast<int>(c.num_hidden_layers), layers_per_stage));
  if (c.moe) {
    layout.ep = ep;
    layout.etp = etp;
  }
  CKPT_RETURN_IF_ERROR(LlamaShardingRules(c).check_layout(layout));
  return layout;
}

Status megatron_moe_export_check(const LlamaConfig& c, int vpp, bool dist_opt, const std::vector<TensorMeta>& tensors) {
  if (c.family != ModelFamily::kMixtral && c.family != ModelFamily::kQwen2Moe)
    return Status::Error("UnsupportedModel", std::string("export-megatron of a ") + model_type_name(c.family) +
                                                 " model: Megatron-Core's routing matches Mixtral's and Qwen2-MoE's (docs/MOE.md)");
  if (c.family == ModelFamily::kQwen2Moe && (c.moe->shared_intermediate == 0 || !c.moe->shared_gate))
    return Status::Error("UnsupportedModel", "export-megatron of a qwen2_moe model without its gated shared expert");
  if (vpp != 1 || dist_opt)
    return Status::Error("UnsupportedModel", "export-megatron of an MoE model with --vpp or --dist-opt (not written yet)");
  for (const auto& t : tensors)
    if (t.name.rfind("optimizer.", 0) == 0)
      return Status::Error("UnsupportedModel", "export-megatron of an MoE model with optimizer state ('" + t.name +
                                                   "'): the experts' Adam state is not written yet")
          .with_tensor(t.name);
  return Status::Ok();
}

}  // namespace ckpt
