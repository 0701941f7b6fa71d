// The mixture-of-experts part of a model config (docs/MOE.md): which layers are MoE, how many
// experts, their width, the shared expert, as the HF families write them in config.json:
//   mixtral    num_local_experts, num_experts_per_tok, intermediate_size (the experts' width);
//              every layer MoE.
//   qwen2_moe  num_experts, num_experts_per_tok, moe_intermediate_size,
//              shared_expert_intermediate_size (a shared expert and its sigmoid gate),
//              mlp_only_layers, decoder_sparse_step (layer i is MoE when (i+1) % step == 0 and i is
//              not in mlp_only_layers; the others are dense with intermediate_size).
//   qwen3_moe  as qwen2_moe without the shared expert (transformers 5 writes num_local_experts).
//   deepseek_v3 n_routed_experts, num_experts_per_tok, moe_intermediate_size, n_shared_experts
//              (one shared MLP of n_shared x moe_intermediate_size, no gate), first_k_dense_replace
//              and moe_layer_freq (layer i is MoE when i >= k and i % freq == 0), the router's
//              e_score_correction_bias; and its attention, MLA (MlaConfig below).
//   gpt_oss    num_local_experts, num_experts_per_tok, intermediate_size (the experts' width); every
//              layer MoE; its own tensors (docs/MOE.md "gpt-oss"): mlp.router.{weight,bias},
//              mlp.experts.gate_up_proj [E, h, 2F] (gate and up interleaved along the last dim,
//              kept so: one canonical tensor) + _bias [E, 2F], mlp.experts.down_proj [E, F, h] +
//              _bias [E, h], self_attn.sinks [H]; attention biases.
// Pure values and functions; thread safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/base/status.h"

namespace ckpt {

// Bounds as kMaxLayers & co. (llama_config.h): far above any real MoE model (DeepSeek-V3: 256
// routed experts, top-8, width 2048), small enough that a hostile config builds nothing large.
inline constexpr int64_t kMaxExperts = int64_t{1} << 14;

enum class ModelFamily { kLlama, kMixtral, kQwen2Moe, kQwen3Moe, kDeepseekV3, kGptOss };

struct MoeConfig {
  int64_t num_experts = 0;            // E
  int64_t top_k = 0;                  // num_experts_per_tok
  int64_t expert_intermediate = 0;    // F of one expert
  int64_t shared_intermediate = 0;    // Fs of the shared expert; 0: none
  bool norm_topk_prob = false;
  bool shared_gate = false;           // the shared expert's sigmoid gate (Qwen2-MoE)
  bool router_bias = false;           // mlp.gate.e_score_correction_bias [E] (DeepSeek-V3)
  std::vector<bool> moe_layer;        // size num_hidden_layers: true where the layer is MoE

  bool is_moe_layer(int64_t layer) const {
    return layer >= 0 && layer < static_cast<int64_t>(moe_layer.size()) && moe_layer[layer];
  }
};

// DeepSeek-V3's multi-head latent attention: q through a low-rank q_a_proj / q_a_layernorm /
// q_b_proj (or one q_proj when q_lora_rank is null), k and v through kv_a_proj_with_mqa
// [kv_lora + rope, h], kv_a_layernorm and kv_b_proj [H * (nope + v), kv_lora]; o_proj [h, H * v].
struct MlaConfig {
  int64_t q_lora_rank = 0;  // 0: no q compression (q_proj [H * (nope + rope), h])
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
};

// The MLA keys of a deepseek_v3 config (InvalidConfig / ConfigTooLarge naming the key).
Result<MlaConfig> parse_mla_config(const nlohmann::json& config);

// The family of a config.json object by its model_type (or, without one, its architectures):
// llama (or none), mixtral, qwen2_moe, qwen3_moe, deepseek_v3, gpt_oss. Others: Unsupported "UnsupportedModel" naming
// the model_type and what ckpt reads.
Result<ModelFamily> model_family_of(const nlohmann::json& config);

// "llama", "mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3", "gpt_oss" (config.json's model_type) and the HF class name.
const char* model_type_name(ModelFamily f);
const char* model_architecture(ModelFamily f);

// Parses the MoE keys of an MoE family's config (named errors "InvalidConfig" / "ConfigTooLarge"
// naming the key). `layers` and `dense_intermediate` are the parsed num_hidden_layers and
// intermediate_size. The keys stay in LlamaConfig::extra (written back verbatim).
Result<MoeConfig> parse_moe_config(const nlohmann::json& config, ModelFamily family, int64_t layers,
                                   int64_t dense_intermediate);

}  // namespace ckpt
