// The LLaMA family's model config (an HF LlamaForCausalLM config.json) and its canonical tensors;
// the MoE families Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V3 and gpt-oss are LLaMA decoders with
// experts (moe_config.h).
// Canonical names are HF's; shapes are HF's [out, in]. See docs/DESIGN.md "Canonical global view".
// Pure values and functions; thread safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "converters/model/moe_config.h"
#include "formats/base/status.h"
#include "formats/dtype/dtype.h"
#include "formats/tensor/tensor_io.h"

namespace ckpt {

// Bounds on every config number that sizes memory or work (tensor lists, layouts, buffers),
// checked by LlamaConfig::validate() before anything is built from a config. Each is far above
// any real LLaMA-family model (Llama 3.1 405B: 126 layers, 128 heads, 8 KV heads, hidden 16384,
// intermediate 53248, vocab 128256, head_dim 128) yet keeps what a config can make ckpt build
// small: kMaxLayers layers are ~kMaxLayers * 13 tensor records (a few MB), not the 1e9 layers of
// a hostile manifest. A value above its bound is a kCorruption "ConfigTooLarge" naming the key.
inline constexpr int64_t kMaxLayers = int64_t{1} << 12;             // 4096 decoder layers
inline constexpr int64_t kMaxHeads = int64_t{1} << 12;              // attention (and KV) heads
inline constexpr int64_t kMaxHiddenSize = int64_t{1} << 18;         // 262144
inline constexpr int64_t kMaxIntermediateSize = int64_t{1} << 20;   // 1048576
inline constexpr int64_t kMaxVocabSize = int64_t{1} << 24;          // 16.7M tokens
inline constexpr int64_t kMaxHeadDim = int64_t{1} << 12;            // 4096
inline constexpr int64_t kMaxPositionEmbeddings = int64_t{1} << 32; // sizes nothing but seq-len checks
// Products, overflow-checked: the elements of one tensor (vocab x hidden is the largest) and the
// parameters of the whole model (405B is ~2^38.6).
inline constexpr int64_t kMaxTensorElements = int64_t{1} << 40;
inline constexpr int64_t kMaxModelParameters = int64_t{1} << 42;

struct LlamaConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;   // H
  int64_t num_key_value_heads = 0;   // K (GQA groups); config default: H
  int64_t head_dim = 0;              // hd; config default: hidden / H
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  int64_t max_position_embeddings = 2048;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  bool mlp_bias = false;
  bool qkv_bias = false;   // q/k/v biases without an o_proj bias (Qwen2-MoE's qkv_bias)
  bool qk_norm = false;    // per-head RMSNorm of q and k (Qwen3-MoE): self_attn.{q,k}_norm.weight [head_dim]
  ModelFamily family = ModelFamily::kLlama;
  std::optional<MoeConfig> moe;  // the MoE families (docs/MOE.md); nullopt: dense
  std::optional<MlaConfig> mla;  // DeepSeek-V3's latent attention instead of q/k/v_proj
  std::string hidden_act = "silu";
  DType dtype = DType::kF32;  // torch_dtype / dtype
  int64_t bos_token_id = 1;
  int64_t eos_token_id = 2;
  nlohmann::json extra = nlohmann::json::object();  // unknown keys, kept for round trips

  // Parses and validates an HF config.json object (positive sizes, H divisible by K,
  // architectures/model_type llama, hidden_act silu). Errors name the key and what was expected.
  // Also runs validate().
  static Result<LlamaConfig> from_json(const nlohmann::json& j);
  static Result<LlamaConfig> from_file(const std::string& path);
  // The HF config.json object transformers loads (architectures, model_type, all keys above).
  nlohmann::json to_json() const;
  // The bounds above (and positivity, H divisible by K): "ConfigTooLarge" naming the key, its
  // value and the bound, or "InvalidConfig". Every path that builds a config outside from_json
  // (Megatron args, a trainer's checkpoint) calls it before using the config.
  Status validate() const;
  // Parameters of the whole model (llama_model_tensors' element count), checked against
  // kMaxModelParameters; validate() has passed.
  int64_t parameter_count() const;
  // OK for a dense LLaMA config; an MoE family's is Unsupported "UnsupportedModel" naming `what`
  // (the commands that do not know experts yet: the trainer, Megatron, profiles).
  Status require_dense(const std::string& what) const;
};

// The canonical model tensors in a fixed order: embed_tokens, then per layer input_layernorm,
// q/k/v/o, post_attention_layernorm, gate/up/down (plus biases when enabled), then model.norm and
// lm_head (untied only). `dtype` is the stored dtype of every tensor. An MoE layer has instead of
// gate/up/down (docs/MOE.md): mlp.gate.weight [E, h] (the router), mlp.experts.{gate,up}_proj.weight
// [E, F, h], mlp.experts.down_proj.weight [E, h, F], and with a shared expert
// mlp.shared_experts.{gate,up,down}_proj.weight (and Qwen2-MoE's mlp.shared_expert_gate.weight
// [1, h]; DeepSeek-V3's router bias mlp.gate.e_score_correction_bias [E]). An MLA layer has
// instead of q/k/v_proj: q_a_proj, q_a_layernorm, q_b_proj (or q_proj), kv_a_proj_with_mqa,
// kv_a_layernorm, kv_b_proj (moe_config.h MlaConfig). A gpt-oss layer adds self_attn.sinks [H] and
// has its own MLP tensors: mlp.router.{weight,bias}, mlp.experts.gate_up_proj [E, h, 2F] (+ _bias
// [E, 2F]), mlp.experts.down_proj [E, F, h] (+ _bias [E, h]) (moe_config.h).
std::vector<TensorMeta> llama_model_tensors(const LlamaConfig& c, DType dtype);

// Parameter names of one decoder layer `i` (same order as llama_model_tensors).
std::vector<std::string> llama_layer_param_names(const LlamaConfig& c, int64_t i);

// Layer index of a canonical name ("model.layers.7.mlp.up_proj.weight" -> 7), or -1 if the
// tensor is not inside a decoder layer. Works for optimizer names ("optimizer.exp_avg.<name>").
int64_t llama_layer_of(const std::string& name);

// True for RMSNorm weights, q/k norms included (no weight decay; replicated under TP).
bool llama_is_norm(const std::string& name);

}  // namespace ckpt
