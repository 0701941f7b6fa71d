// `ckpt plan`'s once-per-step terms and the trainer-like all-to-all figure (docs/PLAN.md "Mixture of
// experts", "Calibrated terms"), against hand computations from the model's shapes: the gradient
// syncs on the calibrated 16 MiB all-reduce (dense over the replicas, experts over edp), the
// optimizer update over the parameters a rank updates (ZeRO-1 shares included) at the calibrated
// rate, and the all-to-all share as `ckpt train` measures it (ETP collectives and the wait for the
// busiest EP rank included); ranks beyond the calibrating machine's cores timeshare them.
#include <gtest/gtest.h>

#include "trainer/plan/cost_model.h"

namespace ckpt::trainer {
namespace plan_step_terms_test {

// Hand count of a tiny Mixtral (4 layers, hidden 64, 4 heads / 2 KV heads of 16, 8 experts of 128,
// top-2, vocab 256, untied): per layer q 64x64, k and v 64x32, o 64x64, 2 norms, router 8x64;
// experts 3 x 8 x 64 x 128; embedding and head 256x64, final norm 64.
constexpr int64_t kDenseParams = 4 * (4096 + 2048 + 2048 + 4096 + 128 + 512) + 2 * 256 * 64 + 64;  // 84544
constexpr int64_t kExpertParams = 4 * 3 * 8 * 64 * 128;                                          // 786432

ModelSpec tiny_mixtral() {
  ModelSpec m{4, 64, 128, 4, 2, 16, 256, false};
  m.experts = 8, m.top_k = 2, m.expert_ffn = 128, m.moe_layers = 4;
  return m;
}

// One node of 4 ranks (nodes empty: one node), fp32.
Cluster one_node(int ranks) {
  Cluster c;
  c.types = {{"X", "", uint64_t{1} << 40, 2e11, 5e9, "fp32", 0.5, ""}};
  c.rank_type.assign(static_cast<size_t>(ranks), 0);
  return c;
}

CostCalibration step_terms() {
  CostCalibration cal;
  cal.allreduce_latency_s = 2e-3;  // the ring's step latency is half of it: 1 ms
  cal.allreduce_bytes_per_s = 1e9;
  cal.sync_bytes_per_s = 1e8;
  cal.update_params_per_s = 1e7;
  return cal;
}

Layout sym(int tp, int dp, int ep, int etp, int zero) {
  nlohmann::json j = {{"tp", tp}, {"pp", 1}, {"dp", dp}, {"zero", zero}, {"layers_per_stage", {4}}, {"ep", ep}, {"etp", etp}};
  auto l = Layout::from_json(j);
  EXPECT_TRUE(l.ok()) << l.status().message();
  return *l;
}

TEST(PlanStepTerms, SyncAndUpdateMatchAHandComputation) {
  const ModelSpec m = tiny_mixtral();
  ASSERT_EQ(m.total_params(), kDenseParams + kExpertParams);
  for (int zero : {0, 1}) {
    // dp4 ep2: dense gradients in a ring of 4, each rank's half of the experts in a ring of edp 2.
    auto c = evaluate(m, one_node(4), sym(1, 4, 2, 1, zero), PlanOptions{8, 16, {}, step_terms()});
    ASSERT_TRUE(c.ok()) << c.status().message();
    const double dense = 2.0 * 3 / 4 * kDenseParams * 4 / 1e8 + 2 * 3 * 1e-3;
    const double expert = 2.0 * 1 / 2 * (kExpertParams / 2) * 4 / 1e8 + 2 * 1 * 1e-3;
    const StageCost& st = c->stages[0];
    EXPECT_NEAR(st.dp_sync_s, dense + expert, 1e-12) << "zero " << zero;
    const double updated = zero ? kDenseParams / 4.0 + kExpertParams / 2 / 2.0 : kDenseParams + kExpertParams / 2.0;
    EXPECT_NEAR(st.update_s, updated / 1e7, 1e-12) << "zero " << zero;
    EXPECT_EQ(stage_rank_updated_params(m, StageShape{4, 1, true, true, 2, 1}, zero ? 4 : 1), static_cast<int64_t>(updated));
    // One stage per pipeline: m micro-batches, then the sync, then the update.
    const PipelineCost& p = c->pipelines[0];
    EXPECT_NEAR(p.time_s, 2 * st.time_s() + dense + expert + updated / 1e7, 1e-12);
  }
  // dp4 ep4: no expert sync (edp 1); tp2 ep1 etp1 (one pipeline): the experts over edp 2, the
  // dense part split by tp needs none.
  auto e4 = evaluate(m, one_node(4), sym(1, 4, 4, 1, 0), PlanOptions{8, 16, {}, step_terms()});
  ASSERT_TRUE(e4.ok());
  EXPECT_NEAR(e4->stages[0].dp_sync_s, 2.0 * 3 / 4 * kDenseParams * 4 / 1e8 + 2 * 3 * 1e-3, 1e-12);
  auto t2 = evaluate(m, one_node(2), sym(2, 1, 1, 1, 0), PlanOptions{8, 16, {}, step_terms()});
  ASSERT_TRUE(t2.ok()) << t2.status().message();
  EXPECT_NEAR(t2->stages[0].dp_sync_s, 2.0 * 1 / 2 * kExpertParams * 4 / 1e8 + 2 * 1e-3, 1e-12);
  // Without the measured terms: the cluster's link (5 GB/s, 5 us a ring step), no update term.
  auto plain = evaluate(m, one_node(4), sym(1, 4, 2, 1, 0), PlanOptions{8, 16, {}, {}});
  ASSERT_TRUE(plain.ok());
  EXPECT_NEAR(plain->stages[0].dp_sync_s,
              2.0 * 3 / 4 * kDenseParams * 4 / 5e9 + 6 * 5e-6 + 2.0 / 2 * (kExpertParams / 2) * 4 / 5e9 + 2 * 5e-6, 1e-12);
  EXPECT_EQ(plain->stages[0].update_s, 0.0);
}

TEST(PlanStepTerms, AllToAllShareCountsWhatTheTrainerMeasures) {
  ModelSpec m = tiny_mixtral();
  m.router_load = 3;
  // tp2 dp2 ep2 etp2, micro-batch 1 x 16 tokens, 8 micro-batches per pipeline (global batch 16).
  CostCalibration cal = step_terms();
  cal.a2a_latency_s = 1e-4, cal.a2a_bytes_per_s = 5e8;
  auto c = evaluate(m, one_node(4), sym(2, 2, 2, 2, 0), PlanOptions{16, 16, {}, cal});
  ASSERT_TRUE(c.ok()) << c.status().message();
  const StageCost& st = c->stages[0];
  // All-to-all: 16 calls (4 per layer), each (16 / 2) tokens x 2 x 64 x 4 bytes x 1/2 x load 2 (ep 2).
  const double a2a = 16 * (8.0 * 2 * 64 * 4 / 2 * 2 / 5e8 + 1e-4);
  EXPECT_NEAR(st.a2a_s, a2a, 1e-12);
  // ETP: 16 calls of half a ring all-reduce over 2 of rows 16 x 2 x 2 / 2 = 32 of 64 floats on the
  // calibrated TP link (1 GB/s, 1 ms a ring step).
  const double etp = 16 * 0.5 * (2.0 * 1 / 2 * 32 * 64 * 4 / 1e9 + 2 * 1e-3);
  // The wait: the busiest rank's extra rows, (2 - 1) x the top-2 experts' FLOPs of 16 tokens, per
  // layer forward + backward (x 3) over tp, at the stage's speed (2e11 x 0.5; no concurrency).
  const double wait = 4 * 3 * (6.0 * 16 * 64 * 2 * 128) / 2 / (2e11 * 0.5);
  EXPECT_NEAR(st.a2a_trainer_s, a2a + etp + wait, 1e-12);
  EXPECT_NEAR(c->a2a_s_per_step, 8 * (a2a + etp + wait), 1e-12);
  // Balanced routing: no wait.
  m.router_load = 1;
  auto b = evaluate(m, one_node(4), sym(2, 2, 2, 2, 0), PlanOptions{16, 16, {}, cal});
  ASSERT_TRUE(b.ok());
  EXPECT_NEAR(b->stages[0].a2a_trainer_s, b->stages[0].a2a_s + etp, 1e-12);
}

TEST(PlanStepTerms, RanksBeyondTheCoresTimeshareThemAndTheUpdate) {
  CostCalibration cal = step_terms();
  cal.concurrency = {1.0, 0.8};
  cal.cores = 2;
  EXPECT_DOUBLE_EQ(cal.speed_scale(2), 0.8);
  EXPECT_DOUBLE_EQ(cal.speed_scale(3), 0.8 * 2 / 3);
  EXPECT_DOUBLE_EQ(cal.speed_scale(4), 0.8 * 2 / 4);
  // dp4 ep4 on a 2-core node: compute and the optimizer update at 0.4 of one process alone.
  const ModelSpec m = tiny_mixtral();
  auto c = evaluate(m, one_node(4), sym(1, 4, 4, 1, 0), PlanOptions{8, 16, {}, cal});
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_NEAR(c->stages[0].update_s, (kDenseParams + kExpertParams / 4.0) / (1e7 * 0.4), 1e-12);
  cal.cores = 8;  // enough cores: the measured factor
  EXPECT_DOUBLE_EQ(cal.speed_scale(4), 0.8);
}

TEST(PlanStepTerms, CalibrationFileTakesTheNewTermsAndRefusesBadOnes) {
  auto ok = CostCalibration::from_json(nlohmann::json::parse(R"({"update_params_per_s": 3e8, "sync_bytes_per_s": 4e8, "cores": 2})"));
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->cores, 2);
  EXPECT_DOUBLE_EQ(ok->update_params_per_s, 3e8);
  EXPECT_DOUBLE_EQ(ok->sync_bytes_per_s, 4e8);
  EXPECT_DOUBLE_EQ(ok->to_json()["sync_bytes_per_s"].get<double>(), 4e8);
  for (const char* bad : {R"({"update_params_per_s": -1})", R"({"sync_bytes_per_s": "fast"})", R"({"cores": 1.5})"}) {
    auto r = CostCalibration::from_json(nlohmann::json::parse(bad));
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), "BadCalibration") << bad;
  }
}

}  // namespace plan_step_terms_test
}  // namespace ckpt::trainer
