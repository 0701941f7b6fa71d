// `ckpt plan` with experts (docs/PLAN.md "Mixture of experts"): the all-to-all term against a hand
// computation; the expert memory per rank of both memory models against a naive count from the
// store's placement (place_in_layout's boxes of every tensor summed per rank, the ZeRO-1 shards of
// zero_layout.h's flat buffers recomputed by hand); the search on a tiny cluster where the experts
// do not fit at ep = 1 picks ep > 1, and its plan passes the trainer's memory check (the same
// function); DeepSeek-V3 refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "converters/model/llama_sharding.h"
#include "reshard/layout/tensor_placement.h"
#include "trainer/memory_estimate.h"
#include "trainer/optim/held_region.h"
#include "trainer/plan/cost_model.h"
#include "trainer/plan/plan_job.h"
#include "trainer/plan/search.h"

namespace ckpt::trainer {
namespace plan_moe_test {

// A tiny Mixtral: 4 MoE layers, 8 experts of width 128, top-2, hidden 64, vocab 256.
LlamaConfig mixtral(int64_t experts = 8) {
  nlohmann::json j = {{"model_type", "mixtral"}, {"architectures", {"MixtralForCausalLM"}}, {"vocab_size", 256},
                      {"hidden_size", 64}, {"intermediate_size", 128}, {"num_hidden_layers", 4},
                      {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"num_local_experts", experts},
                      {"num_experts_per_tok", 2}, {"max_position_embeddings", 64}, {"tie_word_embeddings", false}};
  auto c = LlamaConfig::from_json(j);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return *c;
}

TEST(PlanMoe, AllToAllCostMatchesAHandComputation) {
  const ModelSpec m = ModelSpec::from_config(mixtral());
  ASSERT_TRUE(m.moe());
  const LinkSpec link{1e9, 1e-5};
  // 2 layers at tp 2, ep 4, etp 1; micro-batch 2 x 16 tokens, 4-byte activations. Each rank sends
  // (2 * 16 / 2) tokens * top-2 * 64 * 4 bytes * 3/4 = 6144 bytes per call; 4 calls per layer.
  const StageShape st{2, 2, false, false, 4, 1};
  EXPECT_DOUBLE_EQ(stage_a2a_bytes(m, st, 2, 16, 4), 6144.0);
  EXPECT_NEAR(stage_a2a_s(m, st, 2, 16, 4, link), 8 * (6144.0 / 1e9 + 3 * 1e-5), 1e-15);
  EXPECT_EQ(stage_a2a_s(m, StageShape{2, 2, false, false, 1, 2}, 2, 16, 4, link), 0.0);  // ep 1: no all-to-all
  // The ETP all-gather / reduce-scatter at ep 2 etp 2 (tp 2): rows 2 * 16 * 2 * 2 / 2 = 64 of 64 floats,
  // half a ring all-reduce over 2 (1/2 * 16384 / 1e9 + 1e-5) x 4 per layer, on top of the 4 all-reduces
  // of the [32, 64] activation per layer (2 * 1/2 * 8192 / 1e9 + 2 * 1e-5).
  const double ar = 8 * (8192.0 / 1e9 + 2e-5), etp_part = 8 * (0.5 * 16384.0 / 1e9 + 1e-5);
  EXPECT_NEAR(stage_tp_comm_s(m, StageShape{2, 2, false, false, 2, 2}, 2, 16, 4, link), ar + etp_part, 1e-15);
  EXPECT_NEAR(stage_tp_comm_s(m, StageShape{2, 2, false, false, 2, 1}, 2, 16, 4, link), ar, 1e-15);
  // A router load of 3 (max / mean): at ep 4 the busiest rank sends and computes 3x its balanced
  // share of the routed rows; at ep 2 at most 2x (it holds half the experts); at ep 1 no change.
  ModelSpec loaded = m;
  loaded.router_load = 3;
  EXPECT_DOUBLE_EQ(stage_a2a_bytes(loaded, st, 2, 16, 4), 3 * 6144.0);
  EXPECT_DOUBLE_EQ(stage_a2a_bytes(loaded, StageShape{2, 2, false, false, 2, 1}, 2, 16, 4),
                   2 * stage_a2a_bytes(m, StageShape{2, 2, false, false, 2, 1}, 2, 16, 4));
  const double experts_fwd = 6.0 * 32 * 64 * 2 * 128;  // per layer, the top-2 experts' forward FLOPs
  EXPECT_NEAR(stage_rank_flops(loaded, st, 2, 16), stage_rank_flops(m, st, 2, 16) + 3 * 2 * 2 * experts_fwd / 2, 1e-3);
  const StageShape ep1{2, 2, false, false, 1, 2};
  EXPECT_DOUBLE_EQ(stage_rank_flops(loaded, ep1, 2, 16), stage_rank_flops(m, ep1, 2, 16));
  ModelSpec dense = m;
  dense.experts = 0;
  EXPECT_EQ(stage_a2a_s(dense, st, 2, 16, 4, link), 0.0);
  // FLOPs of an MoE layer: attention as the dense layer's + router 2nDE + top-k experts 6nDkF.
  ModelSpec as_dense = m;
  as_dense.experts = 0, as_dense.moe_layers = 0, as_dense.ffn = 0;
  const double n = 2 * 16;
  EXPECT_DOUBLE_EQ(m.layer_forward_flops(2, 16), as_dense.layer_forward_flops(2, 16) + 2 * n * 64 * 8 + 6 * n * 64 * 2 * 128);
}

// One element's share of a flat buffer of `total` elements padded to 128 * ways, for member d.
int64_t zero_share(int64_t total, int ways, int d) {
  const int64_t unit = 128 * ways, padded = (total + unit - 1) / unit * unit, shard = padded / ways;
  return std::max<int64_t>(0, std::min(total, (d + 1) * shard) - std::min(total, d * shard));
}
int64_t zero_padded(int64_t total, int ways) { return (total + 128 * ways - 1) / (128 * ways) * (128 * ways); }

TEST(PlanMoe, ExpertMemoryPerRankMatchesANaiveCountFromThePlacement) {
  const LlamaConfig c = mixtral();
  const LlamaShardingRules rules(c);
  for (const auto& [ep, etp] : std::vector<std::pair<int, int>>{{2, 1}, {4, 1}, {2, 2}, {1, 1}}) {
    auto made = Layout::make(2, 1, 2, 1, 4);
    ASSERT_TRUE(made.ok());
    Layout l = *made;
    l.ep = ep, l.etp = etp;
    ASSERT_TRUE(l.validate().ok()) << l.to_string();
    // Naive: every model tensor's boxes per rank (weights), and the two Adam moments' ZeRO-1 shares:
    // the dense buffer of (stage, tp rank) over the dp ranks, the expert buffer over the ranks
    // holding the same expert boxes (stage-local rank r: etp rank r % etp, ep rank (r / etp) % ep).
    std::map<int, int64_t> dense, expert;
    for (const TensorMeta& t : llama_model_tensors(c, DType::kF32)) {
      auto placed = place_in_layout(t, l, rules);
      ASSERT_TRUE(placed.ok()) << placed.status().message();
      for (const StagePlacement& sp : *placed)
        for (int j = 0; j < l.tp; ++j) (sp.expert ? expert : dense)[l.rank_of(sp.stage, sp.pipeline, j)] += sp.tp_boxes[j].numel();
    }
    MemoryInputs in;
    in.config = c, in.layout = l, in.seq_len = 16, in.grad_accum = 1;
    auto est = estimate_memory(in);
    ASSERT_TRUE(est.ok()) << est.status().message();
    const int edp = l.tp * l.dp / (ep * etp);
    const ModelSpec m = ModelSpec::from_config(c);
    for (const RankMemory& rm : *est) {
      const int r = rm.rank, local = rm.place.pipeline * l.tp + rm.place.tp_rank;
      const int64_t d = dense[r], e = expert[r];
      EXPECT_EQ(rm.weights, 4 * static_cast<uint64_t>(d + e)) << l.to_string() << " rank " << r;
      // Both moments of the rank's two shards, as allocated (padding included; the share of the
      // real elements is at most that: checked against the flat ranges).
      const int64_t opt = 2 * (zero_padded(d, l.dp) / l.dp + zero_padded(e, edp) / edp);
      EXPECT_EQ(rm.optimizer, 4 * static_cast<uint64_t>(opt)) << l.to_string() << " rank " << r;
      EXPECT_LE(2 * (zero_share(d, l.dp, rm.place.pipeline) + zero_share(e, edp, local / (ep * etp))), opt);
      const int64_t bufs = zero_padded(d, l.dp) + 2 * zero_padded(d, l.dp) / l.dp + zero_padded(e, edp) + 2 * zero_padded(e, edp) / edp;
      EXPECT_EQ(rm.buffers, 4 * static_cast<uint64_t>(bufs)) << l.to_string() << " rank " << r;
      // The megatron formula's parameters per rank: the same count (no vocabulary padding here).
      const StageShape sh{4, 2, true, true, ep, etp};
      EXPECT_EQ(stage_rank_params(m, sh), d + e) << l.to_string();
      EXPECT_EQ(e, 4 * 3 * (8 / ep) * 64 * (128 / etp)) << l.to_string();
    }
  }
}

TEST(PlanMoe, StageEstimateEqualsTheTrainersEstimateOfAnExpertParallelLayout) {
  const LlamaConfig c = mixtral();
  for (const int zero : {0, 1}) {
    auto made = Layout::make(2, 2, 2, zero, 4, {1, 3});
    ASSERT_TRUE(made.ok());
    Layout l = *made;
    l.ep = 4, l.etp = 1;
    MemoryInputs in;
    in.config = c, in.layout = l, in.seq_len = 16, in.grad_accum = 2, in.checkpoints = true, in.mpi = true;
    auto est = estimate_memory(in);
    ASSERT_TRUE(est.ok()) << est.status().message();
    for (int s = 0; s < 2; ++s) {
      StageMemoryQuery q;
      q.layers = l.layers_in_stage(s), q.tp = 2, q.first = s == 0, q.last = s == 1, q.micro_batch = 1, q.seq_len = 16;
      q.slots = std::min(2 - s, 2), q.zero_ways = zero ? 2 : 1, q.pipelines = 2, q.world_size = 8, q.mpi = true;
      q.ep = 4, q.etp = 1;
      auto got = estimate_stage_memory(c, q);
      ASSERT_TRUE(got.ok()) << got.status().message();
      uint64_t want = 0;
      for (const RankMemory& r : *est)
        if (r.place.stage == s) want = std::max(want, r.total() - r.checkpoint);
      // Checkpoint staging aside (the stage estimate counts all the rank holds: docs/PLAN.md "Memory models").
      EXPECT_EQ(got->total() - got->checkpoint, want) << "stage " << s << " zero " << zero << ": " << got->breakdown();
    }
  }
}

Cluster one_type(int devices, uint64_t memory) {
  Cluster c;
  c.types = {{"X", "", memory, 1e10, 2e9, "fp32", 0.5, ""}};
  c.rank_type.assign(static_cast<size_t>(devices), 0);
  return c;
}

TEST(PlanMoe, SearchPicksEpWhenTheExpertsDoNotFitAtEp1AndPassesTheTrainersCheck) {
  const LlamaConfig c = mixtral(16);
  const ModelSpec m = ModelSpec::from_config(c);
  const int64_t seq = 16;
  // Capacity: the trainer's estimate of dp 4 with ep 4 (ZeRO 0), plus 1 MiB: ep 1 holds 4x the
  // experts (16 x 3 x 64 x 128 fp32 weights, gradients and moments per layer) and does not fit.
  auto made = Layout::make(1, 1, 4, 0, 4);
  ASSERT_TRUE(made.ok());
  Layout ep4 = *made;
  ep4.ep = 4;
  MemoryInputs in;
  in.config = c, in.layout = ep4, in.seq_len = seq, in.grad_accum = 1, in.checkpoints = true, in.mpi = true;
  auto est = estimate_memory(in);
  ASSERT_TRUE(est.ok()) << est.status().message();
  uint64_t cap = 0;
  for (const RankMemory& r : *est) cap = std::max(cap, r.total() + (uint64_t{1} << 20));
  const Cluster cl = one_type(4, cap);
  SearchOptions o;
  o.global_batch = 4, o.seq_len = seq, o.top = 2, o.memory_model = MemoryModel::kEmbedded, o.config = &c;
  o.allow_zero = false;
  auto planned = search_layouts(m, cl, o);
  ASSERT_TRUE(planned.ok()) << planned.status().message();
  const PlanCandidate& b = planned->best[0];
  EXPECT_GT(b.layout.ep, 1) << layout_text(b.layout);
  EXPECT_EQ(b.cost.ep, b.layout.ep);
  EXPECT_GT(b.cost.a2a_s_per_step, 0);
  MemoryInputs bi = in;
  bi.layout = b.layout, bi.grad_accum = b.cost.pipelines[0].micro_batches;
  auto best_est = estimate_memory(bi);
  ASSERT_TRUE(best_est.ok()) << best_est.status().message();
  EXPECT_TRUE(check_memory(*best_est, cl).ok()) << check_memory(*best_est, cl).message();
  for (size_t r = 0; r < best_est->size(); ++r) EXPECT_EQ(b.cost.ranks[r].memory, (*best_est)[r].total()) << "rank " << r;
  // The same layout at ep 1 does not fit: the trainer's check refuses it.
  Layout one = b.layout;
  one.ep = 1, one.etp = 0;
  bi.layout = one;
  auto one_est = estimate_memory(bi);
  ASSERT_TRUE(one_est.ok());
  EXPECT_EQ(check_memory(*one_est, cl).code(), "RankOutOfMemory");
  EXPECT_NE(layout_text(b.layout).find("ep="), std::string::npos);
  EXPECT_EQ(b.layout.to_json().value("ep", 0), b.layout.ep);
}

TEST(PlanMoe, DeepSeekV3AndGptOssAreRefusedByName) {
  LlamaConfig c = mixtral();
  EXPECT_TRUE(check_plan_model(c, "ckpt plan").ok());
  c.family = ModelFamily::kDeepseekV3;
  Status s = check_plan_model(c, "ckpt plan");
  EXPECT_EQ(s.code(), "UnsupportedModel");
  EXPECT_NE(s.message().find("MLA"), std::string::npos) << s.message();
  c.family = ModelFamily::kGptOss;
  EXPECT_EQ(check_plan_model(c, "ckpt plan").code(), "UnsupportedModel");
  c.family = ModelFamily::kQwen2Moe;
  EXPECT_TRUE(check_plan_model(c, "ckpt plan").ok());
}

}  // namespace plan_moe_test
}  // namespace ckpt::trainer
