#include "converters/model/llama_config.h"

#include <cctype>
#include <cstring>
#include <optional>
#include <fstream>
#include <set>
#include <sstream>

#include "formats/base/checked.h"
#include "formats/base/json_read.h"

namespace ckpt {

namespace {

Status bad(const std::string& key, const std::string& what) {
  return Status::Error("InvalidConfig", "config key '" + key + "': " + what);
}

Result<int64_t> get_pos_int(const nlohmann::json& j, const char* key, bool required, int64_t dflt) {
  if (!j.contains(key) || j[key].is_null()) {
    if (required) return bad(key, "missing (expected a positive integer)");
    return dflt;
  }
  const auto& v = j[key];
  if (!v.is_number_integer()) return bad(key, "expected an integer, got " + std::string(v.type_name()));
  int64_t x = v.get<int64_t>();
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    return bad(key, "expected a positive integer, got " + v.dump());
  if (x <= 0) return bad(key, "expected a positive integer, got " + std::to_string(x));
  return x;
}

Status too_large(const std::string& key, int64_t v, int64_t max, const char* what) {
  return Status::Error("ConfigTooLarge", "config key '" + key + "': " + std::to_string(v) + " is above ckpt's limit of " +
                                             std::to_string(max) + (*what ? " " : "") + what +
                                             " (far above any real model: the config is corrupt or hostile)");
}

// a * b for the product named `key`, within `max`.
Result<int64_t> bounded_product(const std::string& key, int64_t a, int64_t b, int64_t max, const char* what) {
  auto p = checked_mul(a, b);
  if (!p) return Status::Error("ConfigTooLarge", "config: " + key + " = " + std::to_string(a) + " x " + std::to_string(b) +
                                                     " overflows int64 (limit " + std::to_string(max) + " " + what + ")");
  if (*p > max) return too_large(key, *p, max, what);
  return *p;
}

}  // namespace

Status LlamaConfig::validate() const {
  struct Field {
    const char* key;
    int64_t value, max;
    const char* what;
  };
  const Field fields[] = {
      {"num_hidden_layers", num_hidden_layers, kMaxLayers, "layers"},
      {"num_attention_heads", num_attention_heads, kMaxHeads, "heads"},
      {"num_key_value_heads", num_key_value_heads, kMaxHeads, "heads"},
      {"hidden_size", hidden_size, kMaxHiddenSize, ""},
      {"intermediate_size", intermediate_size, kMaxIntermediateSize, ""},
      {"vocab_size", vocab_size, kMaxVocabSize, "tokens"},
      {"head_dim", head_dim, kMaxHeadDim, ""},
      {"max_position_embeddings", max_position_embeddings, kMaxPositionEmbeddings, "positions"},
  };
  for (const Field& f : fields) {
    if (f.value <= 0) return bad(f.key, "expected a positive integer, got " + std::to_string(f.value));
    if (f.value > f.max) return too_large(f.key, f.value, f.max, f.what);
  }
  if (num_attention_heads % num_key_value_heads != 0)
    return bad("num_key_value_heads", std::to_string(num_key_value_heads) + " does not divide num_attention_heads " +
                                          std::to_string(num_attention_heads));
  CKPT_ASSIGN_OR_RETURN(const int64_t q, bounded_product("num_attention_heads x head_dim", num_attention_heads, head_dim,
                                                         kMaxTensorElements, "elements"));
  CKPT_ASSIGN_OR_RETURN(const int64_t qh, bounded_product("q_proj elements (num_attention_heads x head_dim x hidden_size)", q,
                                                          hidden_size, kMaxTensorElements, "elements per tensor"));
  (void)qh;
  CKPT_RETURN_IF_ERROR(bounded_product("embed_tokens elements (vocab_size x hidden_size)", vocab_size, hidden_size,
                                       kMaxTensorElements, "elements per tensor").status());
  CKPT_RETURN_IF_ERROR(bounded_product("mlp elements (intermediate_size x hidden_size)", intermediate_size, hidden_size,
                                       kMaxTensorElements, "elements per tensor").status());
  if (moe) {
    if (moe->num_experts <= 0 || moe->num_experts > kMaxExperts || moe->top_k <= 0 || moe->top_k > moe->num_experts ||
        moe->expert_intermediate <= 0 || moe->shared_intermediate < 0 ||
        static_cast<int64_t>(moe->moe_layer.size()) != num_hidden_layers)
      return bad("num_experts", "the MoE config is inconsistent (experts " + std::to_string(moe->num_experts) + ", top-k " +
                                    std::to_string(moe->top_k) + ", expert width " + std::to_string(moe->expert_intermediate) + ")");
    CKPT_ASSIGN_OR_RETURN(const int64_t ef, bounded_product("experts x moe_intermediate_size", moe->num_experts,
                                                            moe->expert_intermediate, kMaxTensorElements, "elements"));
    CKPT_RETURN_IF_ERROR(bounded_product("expert tensor elements (experts x moe_intermediate_size x hidden_size)", ef,
                                         hidden_size, kMaxTensorElements, "elements per tensor").status());
  }
  const int64_t n = parameter_count();
  if (n < 0 || n > kMaxModelParameters)
    return Status::Error("ConfigTooLarge", "config: the model has " + (n < 0 ? std::string("more than 2^63") : std::to_string(n)) +
                                               " parameters, above ckpt's limit of " + std::to_string(kMaxModelParameters) +
                                               " (num_hidden_layers " + std::to_string(num_hidden_layers) + ", hidden_size " +
                                               std::to_string(hidden_size) + ")");
  return Status::Ok();
}

int64_t LlamaConfig::parameter_count() const {
  // Within the per-field bounds every term below fits in int64 except the sums; checked anyway (-1 on overflow).
  // Integers and an overflow flag rather than sums of std::optional: g++ 12 at -Os reports a false
  // -Wmaybe-uninitialized on an optional assigned from a conditional (GCC bug 80635).
  const int64_t h = hidden_size, q = num_attention_heads * head_dim, kv = num_key_value_heads * head_dim,
                f = intermediate_size;
  bool overflow = false;
  auto ok = [&](std::optional<int64_t> v) {
    overflow = overflow || !v;
    return v.value_or(0);
  };
  int64_t attn = ok(checked_mul(int64_t{2}, h));             // two norms
  attn = ok(checked_add(attn, ok(checked_mul(q, h))));        // q_proj
  attn = ok(checked_add(attn, ok(checked_mul(2 * kv, h))));   // k_proj, v_proj
  attn = ok(checked_add(attn, ok(checked_mul(h, q))));        // o_proj
  if (attention_bias || qkv_bias) attn = ok(checked_add(attn, q + 2 * kv));
  if (attention_bias) attn = ok(checked_add(attn, h));
  if (qk_norm) attn = ok(checked_add(attn, 2 * head_dim));
  if (mla) {  // replaces q/k/v/o above: two norms, the low-rank projections, o_proj
    const int64_t H = num_attention_heads, qh = mla->qk_head_dim(), ql = mla->q_lora_rank, kl = mla->kv_lora_rank;
    attn = ok(checked_add(ok(checked_mul(int64_t{2}, h)), kl));                                        // norms, kv_a_layernorm
    attn = ok(checked_add(attn, ql > 0 ? ok(checked_add(ok(checked_mul(ql, h + 1)), ok(checked_mul(H * qh, ql))))
                                       : ok(checked_mul(H * qh, h))));                                   // q
    attn = ok(checked_add(attn, ok(checked_mul(kl + mla->qk_rope_head_dim, h))));                       // kv_a_proj_with_mqa
    attn = ok(checked_add(attn, ok(checked_mul(H * (mla->qk_nope_head_dim + mla->v_head_dim), kl))));  // kv_b_proj
    attn = ok(checked_add(attn, ok(checked_mul(h, H * mla->v_head_dim))));                              // o_proj
  }
  int64_t dense = ok(checked_mul(3 * f, h));                  // gate, up, down
  if (mlp_bias) dense = ok(checked_add(dense, 2 * f + h));
  int64_t sparse = 0;                                         // an MoE layer's MLP
  if (moe) {
    const int64_t e = moe->num_experts, fe = moe->expert_intermediate, fs = moe->shared_intermediate;
    sparse = ok(checked_mul(e, h));                                                      // router
    sparse = ok(checked_add(sparse, ok(checked_mul(ok(checked_mul(3 * e, fe)), h))));    // experts
    if (fs > 0) sparse = ok(checked_add(sparse, ok(checked_mul(3 * fs, h))));  // shared expert
    if (fs > 0 && moe->shared_gate) sparse = ok(checked_add(sparse, h));     // its gate
    if (moe->router_bias) sparse = ok(checked_add(sparse, e));
    if (family == ModelFamily::kGptOss) sparse = ok(checked_add(sparse, ok(checked_mul(e, 2 * fe + h))));  // expert biases
  }
  if (family == ModelFamily::kGptOss) attn = ok(checked_add(attn, num_attention_heads));  // sinks
  int64_t all = 0;
  for (int64_t i = 0; i < num_hidden_layers; ++i)
    all = ok(checked_add(all, ok(checked_add(attn, moe && moe->is_moe_layer(i) ? sparse : dense))));
  all = ok(checked_add(all, ok(checked_mul(vocab_size, h))));  // embed_tokens
  if (!tie_word_embeddings) all = ok(checked_add(all, ok(checked_mul(vocab_size, h))));
  all = ok(checked_add(all, h));  // model.norm
  return overflow ? -1 : all;
}

Result<LlamaConfig> LlamaConfig::from_json(const nlohmann::json& j) {
  if (!j.is_object()) return Status::Error("InvalidConfig", "config is not a JSON object");
  LlamaConfig c;
  CKPT_ASSIGN_OR_RETURN(c.family, model_family_of(j));
  CKPT_ASSIGN_OR_RETURN(c.vocab_size, get_pos_int(j, "vocab_size", true, 0));
  CKPT_ASSIGN_OR_RETURN(c.hidden_size, get_pos_int(j, "hidden_size", true, 0));
  CKPT_ASSIGN_OR_RETURN(c.intermediate_size, get_pos_int(j, "intermediate_size", true, 0));
  CKPT_ASSIGN_OR_RETURN(c.num_hidden_layers, get_pos_int(j, "num_hidden_layers", true, 0));
  CKPT_ASSIGN_OR_RETURN(c.num_attention_heads, get_pos_int(j, "num_attention_heads", true, 0));
  CKPT_ASSIGN_OR_RETURN(c.num_key_value_heads, get_pos_int(j, "num_key_value_heads", false, c.num_attention_heads));
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    return bad("num_key_value_heads", std::to_string(c.num_key_value_heads) + " does not divide num_attention_heads " +
                                          std::to_string(c.num_attention_heads));
  int64_t dflt_hd = c.hidden_size / c.num_attention_heads;
  CKPT_ASSIGN_OR_RETURN(c.head_dim, get_pos_int(j, "head_dim", false, dflt_hd));
  if (!j.contains("head_dim") && c.hidden_size % c.num_attention_heads != 0)
    return bad("head_dim", "missing and hidden_size is not divisible by num_attention_heads");
  if (c.head_dim % 2 != 0) return bad("head_dim", "must be even for rotary embeddings, got " + std::to_string(c.head_dim));
  CKPT_ASSIGN_OR_RETURN(c.max_position_embeddings, get_pos_int(j, "max_position_embeddings", false, 2048));
  auto get_num = [&](const char* key, double& out) -> Status {
    if (!j.contains(key) || j[key].is_null()) return Status::Ok();
    if (!j[key].is_number()) return bad(key, "expected a number");
    out = j[key].get<double>();
    if (!(out > 0)) return bad(key, "expected a positive number");
    return Status::Ok();
  };
  CKPT_RETURN_IF_ERROR(get_num("rms_norm_eps", c.rms_norm_eps));
  CKPT_RETURN_IF_ERROR(get_num("rope_theta", c.rope_theta));
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    const auto& rp = j["rope_parameters"];
    if (c.family == ModelFamily::kLlama && rp.contains("rope_type") && rp["rope_type"] != "default")
      return Status::Unsupported("rope_parameters.rope_type " + rp["rope_type"].dump() + " (only \"default\")");
    if (rp.contains("rope_theta")) {
      if (!rp["rope_theta"].is_number()) return bad("rope_parameters.rope_theta", "expected a number");
      c.rope_theta = rp["rope_theta"].get<double>();
    }
  }
  if (c.family == ModelFamily::kLlama && j.contains("rope_scaling") && !j["rope_scaling"].is_null())
    return Status::Unsupported("rope_scaling " + j["rope_scaling"].dump() + " is not supported");
  auto get_bool = [&](const char* key, bool& out) -> Status {
    if (!j.contains(key) || j[key].is_null()) return Status::Ok();
    if (!j[key].is_boolean()) return bad(key, "expected true or false");
    out = j[key].get<bool>();
    return Status::Ok();
  };
  CKPT_RETURN_IF_ERROR(get_bool("tie_word_embeddings", c.tie_word_embeddings));
  CKPT_RETURN_IF_ERROR(get_bool("attention_bias", c.attention_bias));
  CKPT_RETURN_IF_ERROR(get_bool("mlp_bias", c.mlp_bias));
  if (c.family == ModelFamily::kQwen2Moe) {
    c.qkv_bias = true;  // Qwen2-MoE's attention always has q/k/v biases unless the config says otherwise
    CKPT_RETURN_IF_ERROR(get_bool("qkv_bias", c.qkv_bias));
  }
  c.qk_norm = c.family == ModelFamily::kQwen3Moe;
  if (c.family != ModelFamily::kLlama) {
    if (c.num_hidden_layers > kMaxLayers) return too_large("num_hidden_layers", c.num_hidden_layers, kMaxLayers, "layers");
    CKPT_ASSIGN_OR_RETURN(c.moe, parse_moe_config(j, c.family, c.num_hidden_layers, c.intermediate_size));
  }
  if (c.family == ModelFamily::kDeepseekV3) {
    if (c.attention_bias) return Status::Error("UnsupportedModel", "deepseek_v3 with attention_bias (MLA projection biases) is not supported");
    CKPT_ASSIGN_OR_RETURN(c.mla, parse_mla_config(j));
  }
  if (j.contains("hidden_act")) {
    if (!j["hidden_act"].is_string() || j["hidden_act"] != "silu")
      return Status::Unsupported("hidden_act " + j["hidden_act"].dump() + " (only \"silu\")");
  }
  for (const char* key : {"dtype", "torch_dtype"}) {
    if (j.contains(key) && j[key].is_string()) {
      std::string s = j[key];
      if (s == "float32") c.dtype = DType::kF32;
      else if (s == "bfloat16") c.dtype = DType::kBF16;
      else if (s == "float16") c.dtype = DType::kF16;
      else return Status::Unsupported("config " + std::string(key) + " \"" + s + "\"");
      break;
    }
  }
  if (j.contains("bos_token_id") && j["bos_token_id"].is_number_integer()) c.bos_token_id = j["bos_token_id"];
  if (j.contains("eos_token_id") && j["eos_token_id"].is_number_integer()) c.eos_token_id = j["eos_token_id"];
  static const std::set<std::string> known = {
      "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
      "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "max_position_embeddings",
      "tie_word_embeddings", "attention_bias", "mlp_bias", "hidden_act", "dtype", "torch_dtype",
      "bos_token_id", "eos_token_id", "architectures", "model_type"};
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!known.count(it.key())) c.extra[it.key()] = it.value();
  CKPT_RETURN_IF_ERROR(c.validate());
  return c;
}

Result<LlamaConfig> LlamaConfig::from_file(const std::string& path) {
  CKPT_ASSIGN_OR_RETURN(nlohmann::json j, read_json_file(path, kConfigJsonLimits, "model config"));
  auto r = from_json(j);
  if (!r.ok()) return r.take_status().with_file(path);
  return r;
}

nlohmann::json LlamaConfig::to_json() const {
  nlohmann::json j = extra;
  j["architectures"] = {model_architecture(family)};
  j["model_type"] = model_type_name(family);
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  j["max_position_embeddings"] = max_position_embeddings;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["attention_bias"] = attention_bias;
  j["mlp_bias"] = mlp_bias;
  j["hidden_act"] = hidden_act;
  const char* dt = dtype == DType::kBF16 ? "bfloat16" : dtype == DType::kF16 ? "float16" : "float32";
  j["torch_dtype"] = dt;
  j["bos_token_id"] = bos_token_id;
  j["eos_token_id"] = eos_token_id;
  return j;
}

Status LlamaConfig::require_dense(const std::string& what) const {
  if (!moe) return Status::Ok();
  return Status::Error("UnsupportedModel", what + " does not support mixture-of-experts models yet (this is a " +
                                               model_type_name(family) + " config, " + std::to_string(moe->num_experts) +
                                               " experts; docs/MOE.md says which commands do)");
}

namespace {

// post_attention_layernorm and the MLP of layer `i` (prefix `p`): dense, or the MoE layer's.
void llama_mlp_param_names(const LlamaConfig& c, int64_t i, const std::string& p, std::vector<std::string>& n) {
  n.push_back(p + "post_attention_layernorm.weight");
  if (c.family == ModelFamily::kGptOss) {  // every layer: router and experts with biases (moe_config.h)
    for (const char* m : {"router.weight", "router.bias", "experts.gate_up_proj", "experts.gate_up_proj_bias", "experts.down_proj",
                          "experts.down_proj_bias"})
      n.push_back(p + "mlp." + m);
    return;
  }
  if (c.moe && c.moe->is_moe_layer(i)) {
    n.push_back(p + "mlp.gate.weight");
    if (c.moe->router_bias) n.push_back(p + "mlp.gate.e_score_correction_bias");
    for (const char* m : {"experts.gate_proj.weight", "experts.up_proj.weight", "experts.down_proj.weight"})
      n.push_back(p + "mlp." + m);
    if (c.moe->shared_intermediate > 0)
      for (const char* m : {"shared_experts.gate_proj.weight", "shared_experts.up_proj.weight", "shared_experts.down_proj.weight"})
        n.push_back(p + "mlp." + m);
    if (c.moe->shared_intermediate > 0 && c.moe->shared_gate) n.push_back(p + "mlp.shared_expert_gate.weight");
    return;
  }
  for (const char* m : {"gate_proj", "up_proj", "down_proj"}) {
    n.push_back(p + "mlp." + m + ".weight");
    if (c.mlp_bias) n.push_back(p + "mlp." + m + ".bias");
  }
}

}  // namespace

std::vector<std::string> llama_layer_param_names(const LlamaConfig& c, int64_t i) {
  const std::string p = "model.layers." + std::to_string(i) + ".";
  const bool qkv_bias = c.attention_bias || c.qkv_bias;
  std::vector<std::string> n;
  if (c.mla) {
    n.push_back(p + "input_layernorm.weight");
    if (c.mla->q_lora_rank > 0)
      for (const char* m : {"q_a_proj.weight", "q_a_layernorm.weight", "q_b_proj.weight"}) n.push_back(p + "self_attn." + m);
    else
      n.push_back(p + "self_attn.q_proj.weight");
    for (const char* m : {"kv_a_proj_with_mqa.weight", "kv_a_layernorm.weight", "kv_b_proj.weight", "o_proj.weight"})
      n.push_back(p + "self_attn." + m);
    llama_mlp_param_names(c, i, p, n);
    return n;
  }
  n = {p + "input_layernorm.weight", p + "self_attn.q_proj.weight"};
  if (qkv_bias) n.push_back(p + "self_attn.q_proj.bias");
  n.push_back(p + "self_attn.k_proj.weight");
  if (qkv_bias) n.push_back(p + "self_attn.k_proj.bias");
  n.push_back(p + "self_attn.v_proj.weight");
  if (qkv_bias) n.push_back(p + "self_attn.v_proj.bias");
  n.push_back(p + "self_attn.o_proj.weight");
  if (c.attention_bias) n.push_back(p + "self_attn.o_proj.bias");
  if (c.family == ModelFamily::kGptOss) n.push_back(p + "self_attn.sinks");
  if (c.qk_norm) {
    n.push_back(p + "self_attn.q_norm.weight");
    n.push_back(p + "self_attn.k_norm.weight");
  }
  llama_mlp_param_names(c, i, p, n);
  return n;
}

namespace {

// The shape of an MLA attention tensor (false for other names).
bool mla_shape(const LlamaConfig& c, const std::string& name, Shape* s) {
  const MlaConfig& a = *c.mla;
  const int64_t h = c.hidden_size, H = c.num_attention_heads;
  auto is = [&](const char* sfx) { return name.ends_with(std::string("self_attn.") + sfx); };
  if (is("q_a_proj.weight")) *s = {a.q_lora_rank, h};
  else if (is("q_a_layernorm.weight")) *s = {a.q_lora_rank};
  else if (is("q_b_proj.weight")) *s = {H * a.qk_head_dim(), a.q_lora_rank};
  else if (is("q_proj.weight")) *s = {H * a.qk_head_dim(), h};
  else if (is("kv_a_proj_with_mqa.weight")) *s = {a.kv_lora_rank + a.qk_rope_head_dim, h};
  else if (is("kv_a_layernorm.weight")) *s = {a.kv_lora_rank};
  else if (is("kv_b_proj.weight")) *s = {H * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank};
  else if (is("o_proj.weight")) *s = {h, H * a.v_head_dim};
  else return false;
  return true;
}

// The shape of a gpt-oss tensor of its own (false for the LLaMA-named ones).
bool gpt_oss_shape(const LlamaConfig& c, const std::string& name, Shape* s) {
  const int64_t e = c.moe->num_experts, f = c.moe->expert_intermediate, h = c.hidden_size;
  if (name.ends_with("self_attn.sinks")) *s = {c.num_attention_heads};
  else if (name.ends_with("mlp.router.weight")) *s = {e, h};
  else if (name.ends_with("mlp.router.bias")) *s = {e};
  else if (name.ends_with("mlp.experts.gate_up_proj")) *s = {e, h, 2 * f};
  else if (name.ends_with("mlp.experts.gate_up_proj_bias")) *s = {e, 2 * f};
  else if (name.ends_with("mlp.experts.down_proj")) *s = {e, f, h};
  else if (name.ends_with("mlp.experts.down_proj_bias")) *s = {e, h};
  else return false;
  return true;
}

}  // namespace

std::vector<TensorMeta> llama_model_tensors(const LlamaConfig& c, DType dt) {
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim,
                kv = c.num_key_value_heads * c.head_dim, f = c.intermediate_size;
  std::vector<TensorMeta> t;
  t.push_back({"model.embed_tokens.weight", dt, {c.vocab_size, h}});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    for (const auto& name : llama_layer_param_names(c, i)) {
      auto ends = [&](const char* s) {
        return name.size() >= std::strlen(s) && name.compare(name.size() - std::strlen(s), std::string::npos, s) == 0;
      };
      Shape s;
      const int64_t e = c.moe ? c.moe->num_experts : 0, fe = c.moe ? c.moe->expert_intermediate : 0,
                    fs = c.moe ? c.moe->shared_intermediate : 0;
      if (c.mla && mla_shape(c, name, &s)) {
      } else if (c.family == ModelFamily::kGptOss && gpt_oss_shape(c, name, &s)) {
      } else if (ends("layernorm.weight")) s = {h};
      else if (ends("q_norm.weight") || ends("k_norm.weight")) s = {c.head_dim};
      else if (ends("gate.e_score_correction_bias")) s = {e};
      else if (ends("mlp.gate.weight")) s = {e, h};
      else if (ends("mlp.experts.gate_proj.weight") || ends("mlp.experts.up_proj.weight")) s = {e, fe, h};
      else if (ends("mlp.experts.down_proj.weight")) s = {e, h, fe};
      else if (ends("shared_experts.gate_proj.weight") || ends("shared_experts.up_proj.weight")) s = {fs, h};
      else if (ends("shared_experts.down_proj.weight")) s = {h, fs};
      else if (ends("shared_expert_gate.weight")) s = {1, h};
      else if (ends("q_proj.weight")) s = {q, h};
      else if (ends("q_proj.bias")) s = {q};
      else if (ends("k_proj.weight") || ends("v_proj.weight")) s = {kv, h};
      else if (ends("k_proj.bias") || ends("v_proj.bias")) s = {kv};
      else if (ends("o_proj.weight")) s = {h, q};
      else if (ends("o_proj.bias")) s = {h};
      else if (ends("gate_proj.weight") || ends("up_proj.weight")) s = {f, h};
      else if (ends("gate_proj.bias") || ends("up_proj.bias")) s = {f};
      else if (ends("down_proj.weight")) s = {h, f};
      else if (ends("down_proj.bias")) s = {h};
      t.push_back({name, dt, s});
    }
  }
  t.push_back({"model.norm.weight", dt, {h}});
  if (!c.tie_word_embeddings) t.push_back({"lm_head.weight", dt, {c.vocab_size, h}});
  return t;
}

int64_t llama_layer_of(const std::string& name) {
  static const std::string key = "model.layers.";
  auto pos = name.find(key);
  if (pos == std::string::npos) return -1;
  pos += key.size();
  int64_t v = 0;
  size_t i = pos;
  while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i])) && i - pos < 9) v = v * 10 + (name[i++] - '0');
  if (i == pos || i >= name.size() || name[i] != '.') return -1;
  return v;
}

bool llama_is_norm(const std::string& name) {
  return name.find("layernorm.weight") != std::string::npos || name.ends_with("model.norm.weight") ||
         name.ends_with("self_attn.q_norm.weight") || name.ends_with("self_attn.k_norm.weight");
}

}  // namespace ckpt
