// trainer/memory_estimate.h on general layouts with per-stage expert parallelism (docs/MOE.md
// "The trainer on these layouts"), the function `ckpt train --cluster` checks: each rank's weights
// against a naive count from the store's placement (place_in_layout's boxes of every tensor summed
// per world rank), its ZeRO-1 optimizer shards (uniform pipelines) recomputed by hand from those
// counts (zero_layout.h: dense buffer over the pipelines, expert buffer over edp = tp P / (ep etp),
// both padded to 128 x ways), and the activations of an expert-parallel stage equal to those of the
// same stage in the symmetric layout of its stage view (the stage's own etp, not the layout's).
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "converters/model/llama_sharding.h"
#include "reshard/layout/tensor_placement.h"
#include "trainer/memory_estimate.h"

namespace ckpt::trainer {
namespace memory_estimate_experts_test {  // named, not anonymous: unique in a unity batch

// A tiny Mixtral: 4 MoE layers, 8 experts of width 128, top-2, hidden 64, vocab 256.
LlamaConfig mixtral() {
  nlohmann::json j = {{"model_type", "mixtral"}, {"architectures", {"MixtralForCausalLM"}}, {"vocab_size", 256},
                      {"hidden_size", 64}, {"intermediate_size", 128}, {"num_hidden_layers", 4},
                      {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"num_local_experts", 8},
                      {"num_experts_per_tok", 2}, {"max_position_embeddings", 64}, {"tie_word_embeddings", false}};
  auto c = LlamaConfig::from_json(j);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return *c;
}

StageSpec st(int layers, int tp, int ep = 1, int etp = 0) { return StageSpec{layers, tp, "", ep, etp}; }

Layout general(std::vector<PipelineSpec> pls, int zero) {
  auto l = Layout::from_pipelines(std::move(pls), zero);
  EXPECT_TRUE(l.ok()) << l.status().message();
  return *l;
}

// Naive: the elements of every model tensor's boxes per world rank, dense and expert apart.
void naive_counts(const LlamaConfig& c, const Layout& l, std::map<int, int64_t>* dense, std::map<int, int64_t>* expert) {
  const LlamaShardingRules rules(c);
  for (const TensorMeta& t : llama_model_tensors(c, DType::kF32)) {
    auto placed = place_in_layout(t, l, rules);
    ASSERT_TRUE(placed.ok()) << placed.status().message();
    const bool is_expert = t.name.find(".mlp.experts.") != std::string::npos;  // also on stages without ep
    for (const StagePlacement& sp : *placed)
      for (int j = 0; j < static_cast<int>(sp.tp_boxes.size()); ++j)
        (is_expert ? *expert : *dense)[l.rank_of(sp.stage, sp.pipeline, j)] += sp.tp_boxes[static_cast<size_t>(j)].numel();
  }
}

int64_t padded(int64_t total, int ways) { return (total + 128 * ways - 1) / (128 * ways) * (128 * ways); }

MemoryInputs inputs(const Layout& l) {
  MemoryInputs in;
  in.config = mixtral(), in.layout = l, in.seq_len = 16, in.grad_accum = 2;
  return in;
}

TEST(MemoryEstimateExperts, NonUniformPipelinesCountEachStagesOwnExperts) {
  // A [2 layers tp2 ep2 etp1 | 2 layers tp1] (mb 2), B [1 layer tp1 | 3 layers tp2 ep2 etp1] (mb 1).
  const Layout l = general({{2, {st(2, 2, 2, 1), st(2, 1)}}, {1, {st(1, 1), st(3, 2, 2, 1)}}}, 0);
  std::map<int, int64_t> dense, expert;
  naive_counts(mixtral(), l, &dense, &expert);
  auto est = estimate_memory(inputs(l));
  ASSERT_TRUE(est.ok()) << est.status().message();
  ASSERT_EQ(est->size(), 6u);
  for (const RankMemory& rm : *est) {
    const int r = rm.rank;
    EXPECT_EQ(rm.weights, 4 * static_cast<uint64_t>(dense[r] + expert[r])) << "rank " << r;
    EXPECT_EQ(rm.optimizer, 2 * rm.weights) << "rank " << r;
    // An ep2 x etp1 stage holds 4 of the 8 experts whole per rank; a tp1 stage all 8.
    const int64_t per_layer = l.stage_ep(rm.place.pipeline, rm.place.stage) == 2 ? 4 : 8;
    EXPECT_EQ(expert[r], l.stage_layers(rm.place.pipeline, rm.place.stage) * per_layer * 3 * 64 * 128) << "rank " << r;
  }
}

TEST(MemoryEstimateExperts, UniformPipelinesZeroOneShardsOverTheStagesExpertGroups) {
  // Two pipelines, ZeRO-1, the dense buffers over the 2 pipelines: [2 tp2 ep2 (etp 2) | 2 tp1 ep2]
  // (edp 1 on both stages); [2 tp2 ep2 etp1 | 2 tp1 ep2] (stage 0 edp 2); [2 tp2 ep2 | 2 tp1] (stage 1
  // without ep: its experts whole, in the dense buffer).
  for (const auto& stages : std::vector<std::vector<StageSpec>>{
           {st(2, 2, 2), st(2, 1, 2)}, {st(2, 2, 2, 1), st(2, 1, 2)}, {st(2, 2, 2), st(2, 1)}}) {
    const Layout l = general({{2, stages}, {1, stages}}, 1);
    std::map<int, int64_t> dense, expert;
    naive_counts(mixtral(), l, &dense, &expert);
    auto est = estimate_memory(inputs(l));
    ASSERT_TRUE(est.ok()) << est.status().message();
    ASSERT_EQ(est->size(), 6u);
    for (const RankMemory& rm : *est) {
      const int r = rm.rank, p = rm.place.pipeline, s = rm.place.stage;
      const int tp = l.stage_tp(p, s), ep = l.stage_ep(p, s), etp = l.stage_expert_tp(p, s), edp = tp * 2 / (ep * etp);
      const bool expert_parallel = ep > 1 || etp != tp;
      EXPECT_EQ(rm.weights, 4 * static_cast<uint64_t>(dense[r] + expert[r])) << l.to_string() << " rank " << r;
      EXPECT_EQ(expert[r], 2 * (8 / ep) * 3 * 64 * (128 / etp)) << l.to_string() << " rank " << r;
      const int64_t d = expert_parallel ? dense[r] : dense[r] + expert[r], e = expert_parallel ? expert[r] : 0;
      const int64_t opt = 2 * (padded(d, 2) / 2 + (e ? padded(e, edp) / edp : 0));
      EXPECT_EQ(rm.optimizer, 4 * static_cast<uint64_t>(opt)) << l.to_string() << " rank " << r;
      const int64_t bufs = padded(d, 2) + 2 * padded(d, 2) / 2 + (e ? padded(e, edp) + 2 * padded(e, edp) / edp : 0);
      EXPECT_EQ(rm.buffers, 4 * static_cast<uint64_t>(bufs)) << l.to_string() << " rank " << r;
    }
  }
}

TEST(MemoryEstimateExperts, ActivationsFollowTheStagesExpertTp) {
  // Pipeline A's first stage (2 layers tp2 ep2 etp1, mb 2, 2 slots) against the symmetric tp2 pp2
  // [2, 2] ep2 etp1 layout with mb 2 (its stage view's placement): the same activations. Its routed
  // rows are n k etp / tp = n k / 2, not n k as with etp = tp.
  const Layout g = general({{2, {st(2, 2, 2, 1), st(2, 1)}}, {1, {st(1, 1), st(3, 2, 2, 1)}}}, 0);
  auto made = Layout::make(2, 2, 1, 0, 4, {2, 2});
  ASSERT_TRUE(made.ok());
  Layout sym = *made;
  sym.ep = 2, sym.etp = 1, sym.micro_batch = {2};
  auto eg = estimate_memory(inputs(g));
  auto es = estimate_memory(inputs(sym));
  ASSERT_TRUE(eg.ok() && es.ok());
  for (int t = 0; t < 2; ++t) {
    const RankMemory& a = (*eg)[static_cast<size_t>(g.rank_of(0, 0, t))];
    const RankMemory& b = (*es)[static_cast<size_t>(sym.rank_of(0, 0, t))];
    EXPECT_EQ(a.activations, b.activations) << "tp rank " << t;
    EXPECT_EQ(a.workspace, b.workspace) << "tp rank " << t;
    EXPECT_EQ(a.weights, b.weights) << "tp rank " << t;
  }
}

}  // namespace memory_estimate_experts_test
}  // namespace ckpt::trainer
