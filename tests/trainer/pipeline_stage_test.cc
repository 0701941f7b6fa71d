// Pipeline stages run by hand in one process: models of stages [0,a) [a,L) (and three uneven
// stages), stage_forward / stage_backward chained with several micro-batches in flight in a
// 1F1B order (warm-up forwards, one-forward-one-backward, cool-down backwards), against the
// one-process Model::forward_backward of the whole model on the same data (the oracle): losses
// and every parameter gradient in float64 (1e-12 relative to the tensor's largest gradient).
// Tied embeddings over 2 stages: the sum of the two stages' embedding gradients is the
// one-process gradient. MoE models (Mixtral, Qwen2-MoE, Qwen3-MoE with a stage of dense layers):
// the router statistics travel with the activations; dropping them (or aux_dp on the way back)
// fails the comparison.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "trainer/model/init.h"
#include "trainer/model/model.h"

namespace ckpt::trainer {
namespace {

LlamaConfig config(bool tied) {
  LlamaConfig c;
  c.vocab_size = 37;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 4;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.max_position_embeddings = 64;
  c.tie_word_embeddings = tied;
  return c;
}

// Weights from (name, element): the same in every stage and in the whole model, large enough
// for non-trivial gradients everywhere.
void set_weights(Model<double>& m) {
  for (auto* p : m.params()) {
    uint64_t x = fnv1a64(p->name);
    for (auto& v : p->w) {
      x = splitmix64(x);
      const double u = static_cast<double>(x >> 11) * 0x1.0p-53 - 0.5;
      v = p->decay ? 0.4 * u : 1 + 0.5 * u;
    }
  }
}

std::vector<int32_t> ids(int64_t n, int64_t V, uint64_t seed) {
  std::vector<int32_t> r;
  for (int64_t i = 0; i < n; ++i) r.push_back(static_cast<int32_t>((seed = splitmix64(seed)) % V));
  return r;
}

// The 1F1B order of stage s of P over M micro-batches: +j forward of j, -(j+1) backward of j.
std::vector<int> one_f_one_b(int s, int P, int M) {
  std::vector<int> ops;
  const int warm = std::min(P - s - 1, M);
  int f = 0, b = 0;
  for (; f < warm; ++f) ops.push_back(f);
  for (; f < M; ++f, ++b) {
    ops.push_back(f);
    ops.push_back(-(b + 1));
  }
  for (; b < M; ++b) ops.push_back(-(b + 1));
  return ops;
}

// What a test changes in the boundary messages (the MoE tails), to see the comparison fail.
enum class Tamper { kNone, kDropForwardTotals, kZeroAuxDp };

struct PipeResult {
  int most = 0;           // the most slots live at once
  double loss_rel = 0;    // |loss - one process| / |one process|
  double worst_rel = 0;   // the worst gradient error relative to the tensor's largest gradient
  std::string worst_tensor;
};

// Runs the stages of `layers_per_stage` over M micro-batches of b x seq in 1F1B order, against
// the whole model: losses, and every gradient summed over the stages holding it. With an MoE
// config the boundary messages carry the tails of Model::forward_tail / backward_tail.
PipeResult run_pipeline(const LlamaConfig& c, const std::vector<int>& layers_per_stage, int M, int64_t b, int64_t seq,
                        Tamper tamper = Tamper::kNone) {
  const int P = static_cast<int>(layers_per_stage.size());
  auto layout = Layout::make(1, P, 1, 0, static_cast<int>(c.num_hidden_layers), layers_per_stage);
  EXPECT_TRUE(layout.ok()) << layout.status().to_string();
  const int64_t n = b * seq, D = c.hidden_size;
  const double scale = 1.0 / static_cast<double>(M * n);
  auto tok = ids(M * n, c.vocab_size, 1), tgt = ids(M * n, c.vocab_size, 2);

  auto whole = std::move(Model<double>::create(c)).value();
  set_weights(whole);
  double want = 0;
  for (int j = 0; j < M; ++j)
    want += whole.forward_backward(tok.data() + j * n, tgt.data() + j * n, b, seq, scale).value();

  std::vector<Model<double>> st;
  for (int s = 0; s < P; ++s) {
    auto m = Model<double>::create(c, ModelShard{*layout, s, 0, nullptr});
    EXPECT_TRUE(m.ok()) << m.status().to_string();
    st.push_back(std::move(m).value());
    set_weights(st.back());
    st.back().set_slots(P);
  }
  const int64_t nf = n * D + st[0].forward_tail(), nb = n * D + st[0].backward_tail();
  // act[s][j]: output of stage s for micro-batch j; grad[s][j]: d(loss)/d(input of stage s).
  std::vector<std::vector<std::vector<double>>> act(P), grad(P);
  for (int s = 0; s < P; ++s) {
    act[s].assign(M, {});
    grad[s].assign(M, {});
  }
  std::vector<std::vector<int>> ops(P);
  std::vector<size_t> next(P, 0);
  for (int s = 0; s < P; ++s) ops[s] = one_f_one_b(s, P, M);
  PipeResult res;
  double got = 0;
  int live = 0;
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < P; ++s) {
      if (next[s] == ops[s].size()) continue;
      const int op = ops[s][next[s]];
      const int j = op >= 0 ? op : -op - 1;
      if (op >= 0) {
        if (s > 0 && act[s - 1][j].empty()) continue;
        if (s + 1 < P) act[s][j].assign(nf, 0.0);
        auto l = st[s].stage_forward(j % P, tok.data() + j * n, s > 0 ? act[s - 1][j].data() : nullptr,
                                     tgt.data() + j * n, b, seq, scale, s + 1 < P ? act[s][j].data() : nullptr);
        EXPECT_TRUE(l.ok()) << l.status().to_string();
        if (s == 0 && P > 1 && tamper == Tamper::kDropForwardTotals) std::fill(act[0][j].begin() + n * D, act[0][j].end(), 0.0);
        got += *l;
        res.most = std::max(res.most, ++live);
      } else {
        if (s + 1 < P && grad[s + 1][j].empty()) continue;
        if (s > 0) grad[s][j].assign(nb, 0.0);
        auto r = st[s].stage_backward(j % P, s + 1 < P ? grad[s + 1][j].data() : nullptr,
                                      s > 0 ? grad[s][j].data() : nullptr);
        EXPECT_TRUE(r.ok()) << r.to_string();
        if (s == P - 1 && P > 1 && tamper == Tamper::kZeroAuxDp) std::fill(grad[s][j].begin() + n * D, grad[s][j].end(), 0.0);
        --live;
      }
      ++next[s];
      progress = true;
    }
  }
  for (int s = 0; s < P; ++s) EXPECT_EQ(next[s], ops[s].size()) << "stage " << s << " stalled";
  res.loss_rel = std::abs(got - want) / std::abs(want);

  // Every parameter gradient: the sum over the stages holding it equals the whole model's.
  std::map<std::string, std::vector<double>> sum;
  std::map<std::string, int> holders;
  for (auto& m : st)
    for (auto* p : m.params()) {
      auto& g = sum[p->name];
      if (g.empty()) g.assign(p->g.size(), 0.0);
      for (size_t i = 0; i < g.size(); ++i) g[i] += p->g[i];
      ++holders[p->name];
    }
  EXPECT_EQ(sum.size(), whole.params().size());
  for (auto* p : whole.params()) {
    if (!sum.count(p->name)) {
      ADD_FAILURE() << "no stage holds " << p->name;
      continue;
    }
    EXPECT_EQ(holders[p->name], c.tie_word_embeddings && P > 1 && p->name == "model.embed_tokens.weight" ? 2 : 1) << p->name;
    double mx = 0, err = 0;
    for (size_t i = 0; i < p->g.size(); ++i) {
      mx = std::max(mx, std::abs(p->g[i]));
      err = std::max(err, std::abs(sum[p->name][i] - p->g[i]));
    }
    EXPECT_GT(mx, 0) << p->name;
    if (err / mx >= res.worst_rel) res.worst_rel = err / mx, res.worst_tensor = p->name;
  }
  return res;
}

// run_pipeline within 1e-12 (float64); returns the most slots live at once.
int check_pipeline(const LlamaConfig& c, const std::vector<int>& layers_per_stage, int M, int64_t b, int64_t seq) {
  const PipeResult r = run_pipeline(c, layers_per_stage, M, b, seq);
  EXPECT_LE(r.loss_rel, 1e-12);
  EXPECT_LE(r.worst_rel, 1e-12) << r.worst_tensor;
  return r.most;
}
int check_pipeline(bool tied, const std::vector<int>& layers_per_stage, int M, int64_t b, int64_t seq) {
  return check_pipeline(config(tied), layers_per_stage, M, b, seq);
}

TEST(PipelineStages, TwoStagesMatchOneProcess) {
  EXPECT_GE(check_pipeline(false, {1, 3}, 4, 2, 5), 2);
  EXPECT_GE(check_pipeline(false, {3, 1}, 3, 1, 7), 2);
}

TEST(PipelineStages, ThreeUnevenStagesMatchOneProcess) {
  EXPECT_GE(check_pipeline(false, {1, 2, 1}, 5, 2, 4), 3);
  EXPECT_GE(check_pipeline(false, {2, 1, 1}, 2, 1, 6), 2);  // fewer micro-batches than stages
}

TEST(PipelineStages, TiedEmbeddingsOverTwoStages) {
  EXPECT_GE(check_pipeline(true, {2, 2}, 3, 2, 5), 2);
  check_pipeline(true, {1, 2, 1}, 4, 1, 5);
}

// Tiny MoE models of 4 layers (docs/MOE.md), a large load-balancing coefficient so that its
// gradient is a visible share of the routers'.
LlamaConfig pipe_moe_config(const std::string& family, const std::vector<int>& mlp_only = {}) {
  nlohmann::json j = {{"model_type", family}, {"vocab_size", 37}, {"hidden_size", 16}, {"intermediate_size", 24},
                      {"num_hidden_layers", 4}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                      {"head_dim", 4}, {"rms_norm_eps", 1e-5}, {"max_position_embeddings", 64},
                      {"num_experts_per_tok", 2}, {"router_aux_loss_coef", 0.3}};
  if (family == "mixtral") {
    j["num_local_experts"] = 4;
  } else {
    j["num_experts"] = 5;
    j["moe_intermediate_size"] = 6;
    j["mlp_only_layers"] = mlp_only;
    j["norm_topk_prob"] = family == "qwen3_moe";
    if (family == "qwen2_moe") j["shared_expert_intermediate_size"] = 8;
  }
  auto c = LlamaConfig::from_json(j);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return *c;
}

// The router statistics cross the stage boundaries: the one load-balancing loss per micro-batch
// pools the MoE layers of every stage, and its gradient reaches the routers of every stage.
TEST(PipelineStages, MoeStagesMatchOneProcess) {
  EXPECT_GE(check_pipeline(pipe_moe_config("mixtral"), {1, 3}, 3, 2, 5), 2);
  EXPECT_GE(check_pipeline(pipe_moe_config("qwen2_moe"), {2, 2}, 2, 1, 6), 2);
  // Stage 1 holds the dense layers 1 and 2 only: it passes the totals and aux_dp on.
  EXPECT_GE(check_pipeline(pipe_moe_config("qwen3_moe", {1, 2}), {1, 2, 1}, 4, 1, 5), 3);
}

TEST(PipelineStages, MoeBoundaryTailsMatter) {
  const LlamaConfig c = pipe_moe_config("mixtral");
  const auto stage0 = std::move(Model<float>::create(c, StageRange{0, 1})).value();
  EXPECT_EQ(stage0.forward_tail(), (2 * 4 + 1) * 2);  // count, psum, rows as float64 in float elements
  EXPECT_EQ(stage0.backward_tail(), 4);
  EXPECT_EQ(std::move(Model<float>::create(config(false))).value().forward_tail(), 0);
  // Stage 0's totals dropped: the last stage's aux loss (and so the loss and the router gradients) differ.
  PipeResult r = run_pipeline(c, {1, 3}, 3, 2, 5, Tamper::kDropForwardTotals);
  EXPECT_GT(r.loss_rel, 1e-6);
  EXPECT_GT(r.worst_rel, 1e-6);
  // aux_dp not passed back to stage 0: the loss is the same, stage 0's gradients are not.
  r = run_pipeline(c, {1, 3}, 3, 2, 5, Tamper::kZeroAuxDp);
  EXPECT_LE(r.loss_rel, 1e-12);
  EXPECT_GT(r.worst_rel, 1e-6);
  EXPECT_TRUE(r.worst_tensor.starts_with("model.layers.0.") || r.worst_tensor == "model.embed_tokens.weight") << r.worst_tensor;
}

TEST(PipelineStages, MoeLayerUnderTpNeedsItsExpertGroups) {
  auto layout = std::move(Layout::make(2, 2, 1, 0, 4, {2, 2})).value();
  // Qwen3-MoE with layers 0 and 1 dense: stage 1 holds MoE layer 2, whose experts' width is split over
  // TP (trainer/model/moe_dispatch.h: the expert groups of etp = tp); a shard without them is refused
  // (every stage of the layout gets them from ExpertGroups::make_if_expert_parallel).
  const LlamaConfig c = pipe_moe_config("qwen3_moe", {0, 1});
  auto m = Model<double>::create(c, ModelShard{layout, 1, 0, nullptr});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("needs its expert groups"), std::string::npos) << m.status().to_string();
}

TEST(PipelineStages, KvHeadsNotDividedByTpAreRefused) {
  LlamaConfig c = config(false);  // 4 heads, 2 KV heads
  auto layout = std::move(Layout::make(4, 1, 1, 0, 4)).value();
  auto m = Model<float>::create(c, ModelShard{layout, 0, 0, nullptr});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), "LayoutRefused");
  EXPECT_NE(m.status().message().find("num_key_value_heads=2"), std::string::npos) << m.status().to_string();
  EXPECT_NE(m.status().message().find("tp=4"), std::string::npos);
}

}  // namespace
}  // namespace ckpt::trainer
