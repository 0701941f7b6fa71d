// Helpers for the profile tests: tiny configs and a row-by-row listing of a profile tensor
// ("q3" = row 3 of the layer's q_proj, "0" = a zero row) to compare with hand-written lists.
#pragma once

#include <string>
#include <vector>

#include "converters/model/llama_config.h"
#include "converters/profile/profile.h"

namespace ckpt::profile_test {

inline LlamaConfig tiny_config(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t vocab, int64_t layers = 2,
                               int64_t inter = 4) {
  LlamaConfig c;
  c.vocab_size = vocab;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = head_dim;
  c.hidden_size = heads * head_dim;
  c.intermediate_size = inter;
  c.num_hidden_layers = layers;
  c.dtype = DType::kBF16;
  return c;
}

// Short name of a canonical tensor: "q", "k", "v", "o", "gate", "up", "down", "embed", "lm_head",
// "norm", "in_norm", "post_norm" (+ "_b" for biases).
inline std::string short_name(const std::string& canonical) {
  static const std::pair<const char*, const char*> kMap[] = {
      {"q_proj.weight", "q"},       {"k_proj.weight", "k"},     {"v_proj.weight", "v"},    {"o_proj.weight", "o"},
      {"q_proj.bias", "q_b"},       {"k_proj.bias", "k_b"},     {"v_proj.bias", "v_b"},    {"gate_proj.weight", "gate"},
      {"up_proj.weight", "up"},     {"down_proj.weight", "down"}, {"embed_tokens.weight", "embed"},
      {"lm_head.weight", "lm_head"}, {"input_layernorm.weight", "in_norm"}, {"post_attention_layernorm.weight", "post_norm"},
      {"model.norm.weight", "norm"}};
  for (const auto& [suffix, s] : kMap)
    if (canonical.size() >= std::string(suffix).size() &&
        canonical.compare(canonical.size() - std::string(suffix).size(), std::string::npos, suffix) == 0)
      return s;
  return canonical;
}

// One entry per row of the untransposed tensor: "<short name><row>", or "0" for a zero row.
inline std::vector<std::string> row_list(const ProfileTensor& t) {
  std::vector<std::string> rows;
  for (const auto& s : t.segments) {
    if (s.canonical.empty()) {
      for (int64_t r = 0; r < s.zero_rows; ++r) rows.push_back("0");
      continue;
    }
    const int64_t r0 = s.box.ndim() ? s.box.offset[0] : 0;
    for (int64_t r = 0; r < s.rows(); ++r) rows.push_back(short_name(s.canonical) + std::to_string(r0 + r));
  }
  return rows;
}

inline const ProfileTensor* find_tensor(const std::vector<ProfileTensor>& ts, const std::string& name) {
  for (const auto& t : ts)
    if (t.name == name) return &t;
  return nullptr;
}

}  // namespace ckpt::profile_test
