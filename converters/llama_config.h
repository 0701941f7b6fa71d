// The LLaMA family's model config (an HF LlamaForCausalLM config.json) and its canonical tensors.
// Canonical names are HF's; shapes are HF's [out, in]. See docs/DESIGN.md "Canonical global view".
// Pure values and functions; thread safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/dtype.h"
#include "formats/status.h"
#include "formats/tensor_io.h"

namespace ckpt {

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
  std::string hidden_act = "silu";
  DType dtype = DType::kF32;  // torch_dtype / dtype
  int64_t bos_token_id = 1;
  int64_t eos_token_id = 2;
  nlohmann::json extra = nlohmann::json::object();  // unknown keys, kept for round trips

  // Parses and validates an HF config.json object (positive sizes, H divisible by K,
  // architectures/model_type llama, hidden_act silu). Errors name the key and what was expected.
  static Result<LlamaConfig> from_json(const nlohmann::json& j);
  static Result<LlamaConfig> from_file(const std::string& path);
  // The HF config.json object transformers loads (architectures, model_type, all keys above).
  nlohmann::json to_json() const;
};

// The canonical model tensors in a fixed order: embed_tokens, then per layer input_layernorm,
// q/k/v/o, post_attention_layernorm, gate/up/down (plus biases when enabled), then model.norm and
// lm_head (untied only). `dtype` is the stored dtype of every tensor.
std::vector<TensorMeta> llama_model_tensors(const LlamaConfig& c, DType dtype);

// Parameter names of one decoder layer `i` (same order as llama_model_tensors).
std::vector<std::string> llama_layer_param_names(const LlamaConfig& c, int64_t i);

// Layer index of a canonical name ("model.layers.7.mlp.up_proj.weight" -> 7), or -1 if the
// tensor is not inside a decoder layer. Works for optimizer names ("optimizer.exp_avg.<name>").
int64_t llama_layer_of(const std::string& name);

// True for RMSNorm weights (no weight decay; replicated under TP).
bool llama_is_norm(const std::string& name);

}  // namespace ckpt
