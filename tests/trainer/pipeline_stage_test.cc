// Pipeline stages run by hand in one process: models of stages [0,a) [a,L) (and three uneven
// stages), stage_forward / stage_backward chained with several micro-batches in flight in a
// 1F1B order (warm-up forwards, one-forward-one-backward, cool-down backwards), against the
// one-process Model::forward_backward of the whole model on the same data (the oracle): losses
// and every parameter gradient in float64 (1e-12 relative to the tensor's largest gradient).
// Tied embeddings over 2 stages: the sum of the two stages' embedding gradients is the
// one-process gradient.
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

// Runs the stages of `layers_per_stage` over M micro-batches of b x seq in 1F1B order, checks
// losses and gradients against the whole model. Returns the most slots live at once.
int check_pipeline(bool tied, const std::vector<int>& layers_per_stage, int M, int64_t b, int64_t seq) {
  const LlamaConfig c = config(tied);
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
  // act[s][j]: output of stage s for micro-batch j; grad[s][j]: d(loss)/d(input of stage s).
  std::vector<std::vector<std::vector<double>>> act(P), grad(P);
  for (int s = 0; s < P; ++s) {
    act[s].assign(M, {});
    grad[s].assign(M, {});
  }
  std::vector<std::vector<int>> ops(P);
  std::vector<size_t> next(P, 0);
  for (int s = 0; s < P; ++s) ops[s] = one_f_one_b(s, P, M);
  double got = 0;
  int live = 0, most = 0;
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < P; ++s) {
      if (next[s] == ops[s].size()) continue;
      const int op = ops[s][next[s]];
      const int j = op >= 0 ? op : -op - 1;
      if (op >= 0) {
        if (s > 0 && act[s - 1][j].empty()) continue;
        if (s + 1 < P) act[s][j].assign(n * D, 0.0);
        auto l = st[s].stage_forward(j % P, tok.data() + j * n, s > 0 ? act[s - 1][j].data() : nullptr,
                                     tgt.data() + j * n, b, seq, scale, s + 1 < P ? act[s][j].data() : nullptr);
        EXPECT_TRUE(l.ok()) << l.status().to_string();
        got += *l;
        most = std::max(most, ++live);
      } else {
        if (s + 1 < P && grad[s + 1][j].empty()) continue;
        if (s > 0) grad[s][j].assign(n * D, 0.0);
        auto r = st[s].stage_backward(j % P, s + 1 < P ? grad[s + 1][j].data() : nullptr,
                                      s > 0 ? grad[s][j].data() : nullptr);
        EXPECT_TRUE(r.ok()) << r.to_string();
        --live;
      }
      ++next[s];
      progress = true;
    }
  }
  for (int s = 0; s < P; ++s) EXPECT_EQ(next[s], ops[s].size()) << "stage " << s << " stalled";
  EXPECT_NEAR(got, want, 1e-12 * std::abs(want));

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
    EXPECT_EQ(holders[p->name], tied && P > 1 && p->name == "model.embed_tokens.weight" ? 2 : 1) << p->name;
    double mx = 0, err = 0;
    for (size_t i = 0; i < p->g.size(); ++i) {
      mx = std::max(mx, std::abs(p->g[i]));
      err = std::max(err, std::abs(sum[p->name][i] - p->g[i]));
    }
    EXPECT_GT(mx, 0) << p->name;
    EXPECT_LE(err, 1e-12 * mx) << p->name;
  }
  return most;
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

TEST(PipelineStages, SlotMisuseIsAnError) {
  const LlamaConfig c = config(false);
  auto layout = std::move(Layout::make(1, 2, 1, 0, 4, {2, 2})).value();
  auto m = std::move(Model<double>::create(c, ModelShard{layout, 0, 0, nullptr})).value();
  m.set_slots(2);
  std::vector<int32_t> tok(6, 1);
  std::vector<double> out(6 * c.hidden_size), dx(6 * c.hidden_size, 0.0);
  EXPECT_FALSE(m.stage_backward(0, dx.data(), nullptr).ok());          // nothing in flight
  EXPECT_FALSE(m.stage_forward(2, tok.data(), nullptr, nullptr, 1, 6, 1.0, out.data()).ok());  // no slot 2
  EXPECT_FALSE(m.stage_forward(0, tok.data(), nullptr, nullptr, 1, 6, 1.0, nullptr).ok());     // no x_out
  ASSERT_TRUE(m.stage_forward(0, tok.data(), nullptr, nullptr, 1, 6, 1.0, out.data()).ok());
  EXPECT_FALSE(m.stage_forward(0, tok.data(), nullptr, nullptr, 1, 6, 1.0, out.data()).ok());  // still live
  EXPECT_TRUE(m.stage_backward(0, dx.data(), nullptr).ok());
  EXPECT_FALSE(m.forward_backward(tok.data(), tok.data(), 1, 6, 1.0).ok());  // a partial stage
  EXPECT_FALSE(m.has_head());
  EXPECT_EQ(m.params().size(), 1u + 2 * 9);
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
