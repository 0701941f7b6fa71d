// Finite-difference checks of the MoE decoder layer's hand-written backward (trainer/model/moe_mlp.h):
// every parameter of tiny Mixtral, Qwen3-MoE and Qwen2-MoE models (router, stacked experts,
// shared expert and its gate, q/k norms, q/k/v biases, dense layers between MoE ones), in
// float64, with the load-balancing loss included at a large coefficient so that its gradient is
// a visible share of the router's. Central differences with h = 1e-5 (truncation ~h^2, round-off
// ~1e-16 / h relative to the O(1) loss): 1e-6 of the tensor's largest gradient is strict. The top-k
// choice is piecewise constant: a perturbation that changed it would make the loss jump and fail
// the comparison (the perturbed weights keep the routing far from ties). The float32 model is then checked against the float64 one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "tests/trainer/gradcheck_util.h"
#include "trainer/model/model.h"

namespace ckpt::trainer {
namespace {

using namespace gradcheck;  // NOLINT

LlamaConfig moe_config(const std::string& family) {
  nlohmann::json j = {{"model_type", family}, {"vocab_size", 40}, {"hidden_size", 12}, {"intermediate_size", 10},
                      {"num_hidden_layers", 3}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                      {"head_dim", 6}, {"rms_norm_eps", 1e-5}, {"max_position_embeddings", 64},
                      {"num_experts_per_tok", 2}, {"router_aux_loss_coef", 0.3}};
  if (family == "mixtral") {
    j["num_local_experts"] = 4;
  } else {
    j["num_experts"] = 5;
    j["moe_intermediate_size"] = 6;
    j["mlp_only_layers"] = {1};
    j["norm_topk_prob"] = family == "qwen3_moe";
    if (family == "qwen2_moe") j["shared_expert_intermediate_size"] = 8;
  }
  auto c = LlamaConfig::from_json(j);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return *c;
}

void moe_gradcheck(const std::string& family) {
  const LlamaConfig c = moe_config(family);
  auto mr = Model<double>::create(c);
  ASSERT_TRUE(mr.ok()) << mr.status().to_string();
  Model<double> m = std::move(mr).value();
  ASSERT_TRUE(m.init(5).ok());
  perturb(m, 77);
  const int64_t b = 2, seq = 7;
  const auto tok = lcg_ids(b * seq, c.vocab_size, 3), tgt = lcg_ids(b * seq, c.vocab_size, 4);
  const double scale = 1.0 / static_cast<double>(b * seq);
  m.zero_grad();
  auto l = m.forward_backward(tok.data(), tgt.data(), b, seq, scale);
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  const double aux = m.last_aux_loss();
  EXPECT_GT(aux, 1.0);  // E * sum f_e P_e >= top_k-ish: the aux term is present
  int routers = 0, moe_layers = 0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) moe_layers += c.moe->is_moe_layer(i);
  for (auto* p : m.params()) routers += p->name.ends_with("mlp.gate.weight");
  // the routers: every element
  const int kinds = expect_finite_differences(m, tok, tgt, b, seq, scale, [](const std::string& n) { return n.ends_with("mlp.gate.weight"); });
  EXPECT_EQ(kinds, static_cast<int>(llama_model_tensors(c, DType::kF32).size()));
  EXPECT_EQ(routers, moe_layers);
  EXPECT_EQ(moe_layers, family == "mixtral" ? 3 : 2);  // Qwen: layer 1 is in mlp_only_layers
}

TEST(MoeGradCheck, Qwen3MoeQkNormNormTopk) { moe_gradcheck("qwen3_moe"); }
TEST(MoeGradCheck, Qwen2MoeSharedExpertQkvBias) { moe_gradcheck("qwen2_moe"); }

TEST(MoeGradCheck, MixtralEveryLayer) {
  const LlamaConfig c = moe_config("mixtral");
  ASSERT_TRUE(c.moe && c.moe->is_moe_layer(0) && c.moe->is_moe_layer(2));
  moe_gradcheck("mixtral");
}

// The router's gradient with and without the load-balancing loss differ (the aux term reaches
// the router), and the aux loss equals its definition for a uniform router (zero weights: every
// p = 1/E, f_e = picks / rows summing to top_k, so aux = E * sum_e f_e / E = top_k).
TEST(MoeAuxLoss, UniformRouterAndCoefficient) {
  LlamaConfig c = moe_config("qwen3_moe");
  auto m = std::move(Model<double>::create(c)).value();
  ASSERT_TRUE(m.init(5).ok());
  for (auto* p : m.params())
    if (p->name.ends_with("mlp.gate.weight")) std::fill(p->w.begin(), p->w.end(), 0.0);
  const auto tok = lcg_ids(14, c.vocab_size, 3), tgt = lcg_ids(14, c.vocab_size, 4);
  ASSERT_TRUE(m.forward(tok.data(), tgt.data(), 2, 7, nullptr).ok());
  EXPECT_NEAR(m.last_aux_loss(), 2.0, 1e-12);
  c.extra["router_aux_loss_coef"] = -1;
  EXPECT_FALSE(Model<double>::create(c).ok());
  c.extra["router_aux_loss_coef"] = "x";
  EXPECT_FALSE(Model<double>::create(c).ok());
}

TEST(MoeGradCheck, Fp32MatchesFp64) {
  const LlamaConfig c = moe_config("qwen2_moe");
  expect_fp32_matches_fp64(c, lcg_ids(27, c.vocab_size, 5), lcg_ids(27, c.vocab_size, 6));
}

TEST(MoeModelErrors, RefusesWhatItDoesNotRun) {
  LlamaConfig c = moe_config("mixtral");
  c.mla = MlaConfig{};
  EXPECT_EQ(Model<float>::create(c).status().code(), "UnsupportedModel");
}

}  // namespace
}  // namespace ckpt::trainer
