#include "converters/model/moe_config.h"

#include <initializer_list>
#include <set>
#include <utility>

namespace ckpt {

namespace {

Status bad_moe_key(const std::string& key, const std::string& what) {
  return Status::Error("InvalidConfig", "config key '" + key + "': " + what);
}

// A positive integer key within `max` (ConfigTooLarge above it); `dflt` when absent (0: required).
Result<int64_t> moe_pos_int(const nlohmann::json& j, const char* key, int64_t dflt, int64_t max) {
  if (!j.contains(key) || j[key].is_null()) {
    if (dflt > 0) return dflt;
    return bad_moe_key(key, "missing (expected a positive integer)");
  }
  const auto& v = j[key];
  if (!v.is_number_integer() || v.get<int64_t>() <= 0 ||
      (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)))
    return bad_moe_key(key, "expected a positive integer, got " + v.dump());
  if (v.get<int64_t>() > max)
    return Status::Error("ConfigTooLarge", "config key '" + std::string(key) + "': " + v.dump() +
                                               " is above ckpt's limit of " + std::to_string(max) +
                                               " (far above any real model: the config is corrupt or hostile)");
  return v.get<int64_t>();
}

// The first of `keys` present (its name), or the first key when none is.
const char* moe_first_present(const nlohmann::json& j, std::initializer_list<const char*> keys) {
  for (const char* k : keys)
    if (j.contains(k) && !j[k].is_null()) return k;
  return *keys.begin();
}

Result<std::vector<bool>> qwen_moe_layers(const nlohmann::json& j, int64_t layers) {
  CKPT_ASSIGN_OR_RETURN(const int64_t step, moe_pos_int(j, "decoder_sparse_step", 1, layers));
  std::set<int64_t> dense;
  if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null()) {
    const auto& m = j["mlp_only_layers"];
    if (!m.is_array()) return bad_moe_key("mlp_only_layers", "expected a list of layer indices");
    for (const auto& v : m) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= layers)
        return bad_moe_key("mlp_only_layers", "entry " + v.dump() + " is not a layer index in [0, " + std::to_string(layers) + ")");
      dense.insert(v.get<int64_t>());
    }
  }
  std::vector<bool> moe(static_cast<size_t>(layers));
  for (int64_t i = 0; i < layers; ++i) moe[i] = !dense.count(i) && (i + 1) % step == 0;
  return moe;
}

// DeepSeek-V3's shared experts and dense layers (the experts, top-k and width are parsed).
Result<MoeConfig> deepseek_moe(const nlohmann::json& j, int64_t layers, MoeConfig m) {
  CKPT_ASSIGN_OR_RETURN(const int64_t shared, moe_pos_int(j, "n_shared_experts", 1, kMaxExperts));
  if (j.contains("n_shared_experts") && j["n_shared_experts"].is_null()) m.shared_intermediate = 0;
  else m.shared_intermediate = shared * m.expert_intermediate;
  int64_t first_dense = 0;
  if (j.contains("first_k_dense_replace") && !j["first_k_dense_replace"].is_null()) {
    const auto& v = j["first_k_dense_replace"];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > layers)
      return bad_moe_key("first_k_dense_replace", "expected a layer count in [0, " + std::to_string(layers) + "], got " + v.dump());
    first_dense = v.get<int64_t>();
  }
  CKPT_ASSIGN_OR_RETURN(const int64_t freq, moe_pos_int(j, "moe_layer_freq", 1, layers));
  m.router_bias = true;
  m.moe_layer.assign(static_cast<size_t>(layers), false);
  for (int64_t i = first_dense; i < layers; ++i) m.moe_layer[i] = i % freq == 0;
  return m;
}

}  // namespace

Result<MlaConfig> parse_mla_config(const nlohmann::json& j) {
  MlaConfig a;
  constexpr int64_t kMaxRank = int64_t{1} << 16;
  if (j.contains("q_lora_rank") && !j["q_lora_rank"].is_null()) {
    CKPT_ASSIGN_OR_RETURN(a.q_lora_rank, moe_pos_int(j, "q_lora_rank", 0, kMaxRank));
  }
  CKPT_ASSIGN_OR_RETURN(a.kv_lora_rank, moe_pos_int(j, "kv_lora_rank", 0, kMaxRank));
  CKPT_ASSIGN_OR_RETURN(a.qk_nope_head_dim, moe_pos_int(j, "qk_nope_head_dim", 0, kMaxRank));
  CKPT_ASSIGN_OR_RETURN(a.qk_rope_head_dim, moe_pos_int(j, "qk_rope_head_dim", 0, kMaxRank));
  CKPT_ASSIGN_OR_RETURN(a.v_head_dim, moe_pos_int(j, "v_head_dim", 0, kMaxRank));
  return a;
}

Result<ModelFamily> model_family_of(const nlohmann::json& j) {
  static const std::pair<const char*, ModelFamily> kTypes[] = {{"llama", ModelFamily::kLlama},
                                                               {"mixtral", ModelFamily::kMixtral},
                                                               {"qwen2_moe", ModelFamily::kQwen2Moe},
                                                               {"qwen3_moe", ModelFamily::kQwen3Moe},
                                                               {"deepseek_v3", ModelFamily::kDeepseekV3},
                                                               {"gpt_oss", ModelFamily::kGptOss}};
  std::string type;
  if (j.contains("model_type") && j["model_type"].is_string()) {
    type = j["model_type"].get<std::string>();
  } else if (j.contains("model_type") && !j["model_type"].is_null()) {
    return bad_moe_key("model_type", "expected a string, got " + j["model_type"].dump());
  } else if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty()) {
    for (const auto& [t, f] : kTypes)
      if (j["architectures"][0] == model_architecture(f)) return f;
  }
  if (type.empty()) return ModelFamily::kLlama;
  for (const auto& [t, f] : kTypes)
    if (type == t) return f;
  return Status::Error("UnsupportedModel", "config model_type \"" + type +
                                               "\" is no model family ckpt knows (it reads llama, mixtral, qwen2_moe, "
                                               "qwen3_moe, deepseek_v3, gpt_oss)");
}

const char* model_type_name(ModelFamily f) {
  switch (f) {
    case ModelFamily::kMixtral: return "mixtral";
    case ModelFamily::kQwen2Moe: return "qwen2_moe";
    case ModelFamily::kQwen3Moe: return "qwen3_moe";
    case ModelFamily::kDeepseekV3: return "deepseek_v3";
    case ModelFamily::kGptOss: return "gpt_oss";
    default: return "llama";
  }
}

const char* model_architecture(ModelFamily f) {
  switch (f) {
    case ModelFamily::kMixtral: return "MixtralForCausalLM";
    case ModelFamily::kQwen2Moe: return "Qwen2MoeForCausalLM";
    case ModelFamily::kQwen3Moe: return "Qwen3MoeForCausalLM";
    case ModelFamily::kDeepseekV3: return "DeepseekV3ForCausalLM";
    case ModelFamily::kGptOss: return "GptOssForCausalLM";
    default: return "LlamaForCausalLM";
  }
}

Result<MoeConfig> parse_moe_config(const nlohmann::json& j, ModelFamily family, int64_t layers, int64_t dense_intermediate) {
  MoeConfig m;
  const char* experts = moe_first_present(j, {"num_local_experts", "num_experts", "n_routed_experts"});
  CKPT_ASSIGN_OR_RETURN(m.num_experts, moe_pos_int(j, experts, 0, kMaxExperts));
  CKPT_ASSIGN_OR_RETURN(m.top_k, moe_pos_int(j, "num_experts_per_tok", 0, kMaxExperts));
  if (m.top_k > m.num_experts)
    return bad_moe_key("num_experts_per_tok", std::to_string(m.top_k) + " is more than the " + std::to_string(m.num_experts) + " experts");
  if (family == ModelFamily::kMixtral || family == ModelFamily::kGptOss) {
    m.expert_intermediate = dense_intermediate;
    m.router_bias = family == ModelFamily::kGptOss;  // mlp.router.bias [E]
    m.moe_layer.assign(static_cast<size_t>(layers), true);
    return m;
  }
  CKPT_ASSIGN_OR_RETURN(m.expert_intermediate, moe_pos_int(j, "moe_intermediate_size", 0, int64_t{1} << 20));
  if (family == ModelFamily::kDeepseekV3) return deepseek_moe(j, layers, std::move(m));
  m.shared_gate = family == ModelFamily::kQwen2Moe;
  if (family == ModelFamily::kQwen2Moe && j.contains("shared_expert_intermediate_size") &&
      !j["shared_expert_intermediate_size"].is_null()) {
    CKPT_ASSIGN_OR_RETURN(m.shared_intermediate, moe_pos_int(j, "shared_expert_intermediate_size", 0, int64_t{1} << 20));
  }
  if (j.contains("norm_topk_prob") && !j["norm_topk_prob"].is_null()) {
    if (!j["norm_topk_prob"].is_boolean()) return bad_moe_key("norm_topk_prob", "expected true or false");
    m.norm_topk_prob = j["norm_topk_prob"].get<bool>();
  }
  CKPT_ASSIGN_OR_RETURN(m.moe_layer, qwen_moe_layers(j, layers));
  return m;
}

}  // namespace ckpt
