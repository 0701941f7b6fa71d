// trainer/plan: the cost model's FLOPs against a naive count of every matmul's shape; the stage
// split DP against brute force over every split; the 1F1B pipeline time against a simulation of
// micro-batches flowing through the stages; the calibrated terms (concurrency, TP all-reduce per
// call, per-micro-batch and p2p costs) against a naive computation of the step time.
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
    const double K = static_cast<double>(rng() % 5);
    std::vector<std::vector<int>> all;
    std::vector<int> cur;
    compositions(L, S, cur, all);
    double bf_mm = kInfeasible, bf_best = kInfeasible;
    for (const auto& c : all) {
      double mx = 0, md = 0, sum = 0;
      for (int s = 0; s < S; ++s) mx = std::max(mx, t[s][c[s]]), md = std::max(md, d[s][c[s]]), sum += t[s][c[s]];
      bf_mm = std::min(bf_mm, mx);
      bf_best = std::min(bf_best, sum + K * mx + md);  // 1F1B: sum + (m - 1) max, K = m - 1
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

// Micro-batches flowing through the stages in order (each stage one micro-batch at a time, each
// micro-batch one stage at a time): the time the last one leaves the last stage.
double simulate_flow(const std::vector<double>& t, int64_t m) {
  std::vector<double> done(t.size(), 0);  // when stage s finished its latest micro-batch
  for (int64_t i = 0; i < m; ++i) {
    double ready = 0;  // when micro-batch i left the previous stage
    for (size_t s = 0; s < t.size(); ++s) ready = done[s] = std::max(done[s], ready) + t[s];
  }
  return done.back();
}

TEST(PlanCost, PipelineTimeEqualsASimulationOfTheFlow) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<double> t(1 + rng() % 6);
    for (double& x : t) x = 0.1 + static_cast<double>(rng() % 1000) / 100;
    const int64_t m = 1 + static_cast<int64_t>(rng() % 12);
    EXPECT_NEAR(pipeline_1f1b_s(t, m), simulate_flow(t, m), 1e-9 * simulate_flow(t, m));
  }
}

// A one-node cluster of 2 ranks of one type; the calibration of a machine with 2 ranks at once.
Cluster calib_cluster() {
  Cluster c;
  c.types = {{"X", "", uint64_t{1} << 40, 2e11, 5e9, "fp32", 0.5, ""}};
  c.rank_type = {0, 0};
  return c;
}

CostCalibration calib_terms() {
  CostCalibration cal;
  cal.concurrency = {1.0, 0.7};
  cal.allreduce_latency_s = 1e-3;
  cal.allreduce_bytes_per_s = 1e9;
  cal.micro_batch_overhead_s = 2e-3;
  cal.p2p_latency_s = 3e-4;
  return cal;
}

TEST(PlanCost, CalibratedTensorParallelStepEqualsANaiveComputation) {
  const ModelSpec m{4, 64, 128, 4, 2, 16, 256, false};
  auto l = Layout::from_pipelines({PipelineSpec{2, {{4, 2, ""}}}}, 0);
  ASSERT_TRUE(l.ok());
  const int64_t G = 8, s = 32, b = 2, mbs = G / b;
  auto cost = evaluate(m, calib_cluster(), *l, PlanOptions{G, s, {}, calib_terms()});
  ASSERT_TRUE(cost.ok()) << cost.status().message();
  // Per rank: half of every matmul, at 2e11 x 0.5 x 0.7 (2 ranks compute at once); 4 all-reduces
  // per layer + embedding + head of b s D fp32 values, each 1 ms + bytes / 1 GB/s; 2 ms per micro-batch.
  const double compute = 3 * naive_forward_flops(m, b, s) / 2 / (2e11 * 0.5 * 0.7);
  const double calls = 4 * 4 + 2, bytes = double(b * s * m.hidden * 4);
  const double per_mb = compute + calls * (1e-3 + bytes / 1e9) + 2e-3;
  EXPECT_NEAR(cost->step_time_s, mbs * per_mb, 1e-9 * mbs * per_mb);
  // Without the calibration: the cluster's link (5 GB/s, 5 us latency per ring step), one process's speed.
  auto plain = evaluate(m, calib_cluster(), *l, PlanOptions{G, s, {}, {}});
  ASSERT_TRUE(plain.ok());
  const double plain_mb = 3 * naive_forward_flops(m, b, s) / 2 / (2e11 * 0.5) + calls * (bytes / 5e9 + 2 * 5e-6);
  EXPECT_NEAR(plain->step_time_s, mbs * plain_mb, 1e-9 * mbs * plain_mb);
}

TEST(PlanCost, CalibratedPipelineStepEqualsASimulation) {
  const ModelSpec m{6, 64, 128, 4, 2, 16, 256, false};
  for (int first = 1; first <= 5; ++first) {
    auto l = Layout::from_pipelines({PipelineSpec{1, {{first, 1, ""}, {6 - first, 1, ""}}}}, 0);
    ASSERT_TRUE(l.ok());
    const int64_t G = 6, s = 32, b = 1;
    auto cost = evaluate(m, calib_cluster(), *l, PlanOptions{G, s, {}, calib_terms()});
    ASSERT_TRUE(cost.ok()) << cost.status().message();
    // Each stage: its layers' (and the last one's head) FLOPs at 2e11 x 0.5 x 0.7, one message of
    // b s D fp32 values to its neighbour (0.3 ms + bytes / 5 GB/s), 2 ms per micro-batch.
    const double speed = 2e11 * 0.5 * 0.7, msg = 3e-4 + double(b * s * m.hidden * 4) / 5e9;
    ModelSpec one = m;
    one.layers = 1;
    const double layer = 3 * (naive_forward_flops(one, b, s) - 2.0 * b * s * m.hidden * m.vocab);
    const double head = 3 * 2.0 * b * s * m.hidden * m.vocab;
    const std::vector<double> t = {first * layer / speed + msg + 2e-3, ((6 - first) * layer + head) / speed + msg + 2e-3};
    EXPECT_NEAR(cost->step_time_s, simulate_flow(t, G / b), 1e-9 * cost->step_time_s) << "split " << first;
  }
}

TEST(PlanCost, CalibrationFileErrors) {
  auto ok = CostCalibration::from_json(nlohmann::json::parse(
      R"({"cost_terms": {"concurrency": [1, 0.6], "allreduce_latency_s": 1e-4, "allreduce_bytes_per_s": 2e9,
          "micro_batch_overhead_s": 1e-3, "p2p_latency_s": 2e-4, "measured": {"sgemm_alone": 1}}})"));
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_DOUBLE_EQ(ok->speed_scale(1), 1);
  EXPECT_DOUBLE_EQ(ok->speed_scale(2), 0.6);
  EXPECT_DOUBLE_EQ(ok->speed_scale(8), 0.6);  // beyond the measured counts: the last
  EXPECT_DOUBLE_EQ(CostCalibration{}.speed_scale(4), 1);
  for (const char* bad : {R"({"concurrency": [1, 1.5]})", R"({"concurrency": "x"})", R"({"allreduce_latency_s": -1})",
                          R"({"micro_batch_overhead_s": "1ms"})", R"({"typo": 1})", R"([1])"}) {
    auto r = CostCalibration::from_json(nlohmann::json::parse(bad));
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), "BadCalibration") << bad;
  }
}

}  // namespace plan_cost_test
}  // namespace ckpt::trainer
