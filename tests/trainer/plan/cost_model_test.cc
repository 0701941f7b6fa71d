// trainer/plan: the cost model's FLOPs against a naive count of every matmul's shape; the stage
// split DP against brute force over every split.
#include <gtest/gtest.h>

#include <random>

#include "trainer/plan/cost_model.h"
#include "trainer/plan/stage_split.h"

namespace ckpt::trainer {
namespace plan_cost_test {

struct Mm {
  double count, m, k, n;  // count matmuls of [m, k] x [k, n]
};

// Every matmul of a LLaMA forward pass (HF modeling_llama: q/k/v/o projections, per (sequence,
// head) Q K^T and P V, gate/up/down, lm_head).
double naive_forward_flops(const ModelSpec& c, double b, double s) {
  const double n = b * s;
  std::vector<Mm> mms = {
      {1, n, double(c.hidden), double(c.heads * c.head_dim)},     // q_proj
      {2, n, double(c.hidden), double(c.kv_heads * c.head_dim)},  // k_proj, v_proj
      {1, n, double(c.heads * c.head_dim), double(c.hidden)},     // o_proj
      {b * c.heads, s, double(c.head_dim), s},                    // Q K^T (kv heads repeated)
      {b * c.heads, s, s, double(c.head_dim)},                    // P V
      {2, n, double(c.hidden), double(c.ffn)},                    // gate, up
      {1, n, double(c.ffn), double(c.hidden)},                    // down
  };
  double layer = 0;
  for (const Mm& x : mms) layer += x.count * 2 * x.m * x.k * x.n;
  return c.layers * layer + 2 * n * c.hidden * c.vocab;
}

TEST(PlanCost, FlopsMatchANaiveCountOfTheMatmuls) {
  ModelSpec m{80, 8192, 28672, 64, 8, 128, 128256, false};
  EXPECT_NEAR(m.step_flops(4, 4096) / (3 * naive_forward_flops(m, 4, 4096)), 1.0, 1e-12);
  ModelSpec t{6, 64, 176, 4, 2, 16, 264, false};
  EXPECT_NEAR(t.step_flops(3, 64) / (3 * naive_forward_flops(t, 3, 64)), 1.0, 1e-12);
  // A stage's rank does 1/tp of its layers' and head's forward + backward.
  const StageShape last{3, 4, false, true};
  EXPECT_NEAR(stage_rank_flops(m, last, 2, 128) * 4,
              3 * (3 * m.layer_forward_flops(2, 128) + m.head_forward_flops(2, 128)), 1e-3);
  // 70B parameter count (Llama-3-70B: 70.6e9).
  EXPECT_NEAR(m.total_params() / 1e9, 70.55, 0.05);
}

TEST(PlanCost, RingAllReduce) {
  LinkSpec l{1e9, 1e-6};
  EXPECT_DOUBLE_EQ(ring_allreduce_s(4e9, 4, l), 2.0 * 3 / 4 * 4 + 6e-6);
  EXPECT_EQ(ring_allreduce_s(4e9, 1, l), 0);
}

// Brute force: every composition of L into S positive parts.
void compositions(int left, int parts, std::vector<int>& cur, std::vector<std::vector<int>>& out) {
  if (parts == 0) {
    if (left == 0) out.push_back(cur);
    return;
  }
  for (int n = 1; n <= left - (parts - 1); ++n) {
    cur.push_back(n);
    compositions(left - n, parts - 1, cur, out);
    cur.pop_back();
  }
}

TEST(PlanSplit, DynamicProgrammingEqualsBruteForce) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int L = 1 + static_cast<int>(rng() % 9), S = 1 + static_cast<int>(rng() % static_cast<unsigned>(L));
    std::vector<std::vector<double>> t(S, std::vector<double>(L + 1)), d(S, std::vector<double>(L + 1));
    for (int s = 0; s < S; ++s)
      for (int n = 1; n <= L; ++n) {
        t[s][n] = (rng() % 10 == 0) ? kInfeasible : (n * (1 + rng() % 5) + (rng() % 3));  // some infeasible
        d[s][n] = static_cast<double>(rng() % 7) * n;
      }
    const double K = 1 + rng() % 4;
    std::vector<std::vector<int>> all;
    std::vector<int> cur;
    compositions(L, S, cur, all);
    double bf_mm = kInfeasible, bf_best = kInfeasible;
    for (const auto& c : all) {
      double mx = 0, md = 0;
      for (int s = 0; s < S; ++s) mx = std::max(mx, t[s][c[s]]), md = std::max(md, d[s][c[s]]);
      bf_mm = std::min(bf_mm, mx);
      bf_best = std::min(bf_best, K * mx + md);
    }
    auto tf = [&](int s, int n) { return t[s][n]; };
    auto df = [&](int s, int n) { return d[s][n]; };
    const SplitResult mm = min_max_split(L, S, tf);
    const SplitResult bs = best_split(L, S, K, tf, df);
    EXPECT_EQ(mm.ok, bf_mm < kInfeasible);
    EXPECT_EQ(bs.ok, bf_best < kInfeasible);
    if (!mm.ok) continue;
    EXPECT_DOUBLE_EQ(mm.max_time, bf_mm) << "L=" << L << " S=" << S;
    EXPECT_DOUBLE_EQ(bs.value, bf_best) << "L=" << L << " S=" << S;
    int sum = 0;
    double chk = 0;
    for (int s = 0; s < S; ++s) sum += bs.layers[s], chk = std::max(chk, t[s][bs.layers[s]]);
    EXPECT_EQ(sum, L);
    EXPECT_DOUBLE_EQ(chk, bs.max_time);
  }
}

}  // namespace plan_cost_test
}  // namespace ckpt::trainer
