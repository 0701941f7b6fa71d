// trainer/plan/memory_model.h: one memory model for planner and trainer. The planner's per-stage
// estimate (estimate_stage_memory, what the search weighs) against the trainer's estimate of whole
// layouts (estimate_memory: what `ckpt train --cluster` checks) rank by rank; evaluate() with the
// embedded model reports each rank's trainer estimate; the search's plan on a cluster with little
// memory passes the trainer's check (check_memory), where the megatron model's plan does not; a
// device below the trainer's process constant: no layout fits.
#include <gtest/gtest.h>

#include <algorithm>

#include "trainer/memory_estimate.h"
#include "trainer/plan/cost_model.h"
#include "trainer/plan/search.h"

namespace ckpt::trainer {
namespace plan_memory_model_test {

LlamaConfig tiny() {  // fixtures/tiny_llama.json (4 layers)
  auto c = LlamaConfig::from_file(std::string(CKPT_SOURCE_DIR) + "/fixtures/tiny_llama.json");
  EXPECT_TRUE(c.ok()) << c.status().message();
  return *c;
}

std::vector<RankMemory> trainer_estimate(const LlamaConfig& c, const Layout& l, int64_t seq, int64_t accum) {
  MemoryInputs in;
  in.config = c, in.layout = l, in.seq_len = seq, in.grad_accum = accum, in.checkpoints = true, in.mpi = l.world_size() > 1;
  auto est = estimate_memory(in);
  EXPECT_TRUE(est.ok()) << est.status().message();
  return est.ok() ? *est : std::vector<RankMemory>{};
}

TEST(PlanMemoryModel, StageEstimateEqualsTheTrainersEstimateOfTheLayout) {
  const LlamaConfig c = tiny();
  // One pipeline [1 | 2 tp2 | 1] and ZeRO-1 over 2 identical pipelines [3 tp2 | 1].
  const PipelineSpec one{2, {{1, 1, ""}, {2, 2, ""}, {1, 1, ""}}}, zp{1, {{3, 2, ""}, {1, 1, ""}}};
  struct Case { std::vector<PipelineSpec> pls; int zero; int64_t accum; };
  for (const Case& k : {Case{{one}, 0, 4}, Case{{zp, zp}, 1, 2}}) {
    auto l = Layout::from_pipelines(k.pls, k.zero);
    ASSERT_TRUE(l.ok()) << l.status().message();
    const std::vector<RankMemory> est = trainer_estimate(c, *l, 16, k.accum);
    ASSERT_EQ(est.size(), static_cast<size_t>(l->world_size()));
    const int P = l->num_pipelines(), S = l->num_stages(0);
    for (int s = 0; s < S; ++s) {
      StageMemoryQuery q;
      q.layers = l->stage_layers(0, s), q.tp = l->stage_tp(0, s), q.first = s == 0, q.last = s == S - 1;
      q.micro_batch = l->pipeline_micro_batch(0), q.seq_len = 16, q.slots = std::min<int64_t>(S - s, k.accum);
      q.zero_ways = k.zero ? P : 1, q.pipelines = P, q.world_size = l->world_size(), q.mpi = l->world_size() > 1;
      auto got = estimate_stage_memory(c, q);
      ASSERT_TRUE(got.ok()) << got.status().message();
      uint64_t want = 0;
      for (int j = 0; j < q.tp; ++j) want = std::max(want, est[static_cast<size_t>(l->rank_of(s, 0, j))].total());
      EXPECT_EQ(got->total(), want) << "stage " << s << " of " << l->to_string() << ": " << got->breakdown();
    }
  }
}

Cluster one_type(int devices, uint64_t memory) {
  Cluster c;
  c.types = {{"X", "", memory, 1e10, 2e9, "fp32", 0.5, ""}};
  c.rank_type.assign(static_cast<size_t>(devices), 0);
  return c;
}

TEST(PlanMemoryModel, EmbeddedEvaluateReportsTheTrainersEstimatePerRank) {
  const LlamaConfig c = tiny();
  auto l = Layout::from_pipelines({PipelineSpec{1, {{3, 1, ""}, {1, 1, ""}}}, PipelineSpec{3, {{2, 1, ""}, {2, 1, ""}}}}, 0);
  ASSERT_TRUE(l.ok());
  PlanOptions o{8, 16, {}, {}};
  o.memory_model = MemoryModel::kEmbedded, o.config = &c;
  auto cost = evaluate(ModelSpec::from_config(c), one_type(4, uint64_t{1} << 30), *l, o);
  ASSERT_TRUE(cost.ok()) << cost.status().message();
  EXPECT_EQ(cost->memory_model, "embedded");
  const std::vector<RankMemory> est = trainer_estimate(c, *l, 16, 2);  // m = 8 / (1 + 3)
  ASSERT_EQ(cost->ranks.size(), est.size());
  for (size_t r = 0; r < est.size(); ++r) EXPECT_EQ(cost->ranks[r].memory, est[r].total()) << "rank " << r;
}

TEST(PlanMemoryModel, EmbeddedPlanPassesTheTrainersCheckWhereMegatronsDoesNot) {
  const LlamaConfig c = tiny();
  const ModelSpec m = ModelSpec::from_config(c);
  const int64_t seq = 32;
  // Capacity: the trainer's estimate of the two-stage pipeline [2 | 2] with micro-batches of 1 (a
  // layout with little memory per rank), plus 1 MiB.
  auto pp = Layout::from_pipelines({PipelineSpec{1, {{2, 1, ""}, {2, 1, ""}}}}, 0);
  ASSERT_TRUE(pp.ok());
  uint64_t cap = 0;
  for (const RankMemory& r : trainer_estimate(c, *pp, seq, 8)) cap = std::max(cap, r.total() + (uint64_t{1} << 20));
  const Cluster cl = one_type(2, cap);
  SearchOptions o;
  o.global_batch = 8, o.seq_len = seq, o.top = 1;
  auto megatron = search_layouts(m, cl, o);  // the formula sees far less memory: the fastest layout
  ASSERT_TRUE(megatron.ok()) << megatron.status().message();
  const PlanCandidate& f = megatron->best[0];
  EXPECT_EQ(check_memory(trainer_estimate(c, f.layout, seq, f.cost.pipelines[0].micro_batches), cl).code(), "RankOutOfMemory")
      << layout_text(f.layout);
  o.memory_model = MemoryModel::kEmbedded, o.config = &c;
  auto planned = search_layouts(m, cl, o);
  ASSERT_TRUE(planned.ok()) << planned.status().message();
  const PlanCandidate& b = planned->best[0];
  const auto est = trainer_estimate(c, b.layout, seq, b.cost.pipelines[0].micro_batches);
  EXPECT_TRUE(check_memory(est, cl).ok()) << check_memory(est, cl).message();
  ASSERT_EQ(b.cost.ranks.size(), est.size());
  for (size_t r = 0; r < est.size(); ++r) EXPECT_EQ(b.cost.ranks[r].memory, est[r].total()) << "rank " << r;
  EXPECT_EQ(b.cost.memory_model, "embedded");
}

TEST(PlanMemoryModel, BelowTheProcessConstantNothingFits) {
  const LlamaConfig c = tiny();
  SearchOptions o;
  o.global_batch = 4, o.seq_len = 16, o.memory_model = MemoryModel::kEmbedded, o.config = &c;
  const Cluster six = one_type(2, uint64_t{6} << 20);  // the 6 MiB device
  auto r = search_layouts(ModelSpec::from_config(c), six, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), "PlanInfeasible") << r.status().message();
  EXPECT_NE(r.status().message().find("process constant"), std::string::npos) << r.status().message();
  o.memory_model = MemoryModel::kMegatron;  // the formula alone fits it (what `ckpt train` then refused)
  EXPECT_TRUE(search_layouts(ModelSpec::from_config(c), six, o).ok());
}

}  // namespace plan_memory_model_test
}  // namespace ckpt::trainer
