// trainer/memory_estimate.h: the weights of a rank against the parameter counts written out by
// hand from the config (LLaMA shapes, Megatron TP split), the optimizer against the weights
// (zero 0: two moments; zero 1: the DP share), the general form against the stage view of each
// rank, and check_memory naming the first rank that does not fit, in a layout with device types.
// (tests/python/test_trainer_memory.py checks the totals against each rank's measured peak RSS.)
#include "trainer/memory_estimate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

namespace ckpt::trainer {
namespace memory_estimate_test {  // named, not anonymous: unique in a unity batch

LlamaConfig tiny() {  // fixtures/tiny_llama.json
  auto c = LlamaConfig::from_file(std::string(CKPT_SOURCE_DIR) + "/fixtures/tiny_llama.json");
  EXPECT_TRUE(c.ok()) << c.status().message();
  return *c;
}

MemoryInputs inputs(const Layout& l, int64_t accum = 1) {
  MemoryInputs in;
  in.config = tiny();
  in.layout = l;
  in.seq_len = 16;
  in.grad_accum = accum;
  return in;
}

// Parameters of one decoder layer / the vocabulary tensors at tensor-parallel size tp, by hand.
int64_t layer_params(const LlamaConfig& c, int tp) {
  const int64_t D = c.hidden_size, Q = c.num_attention_heads * c.head_dim, KV = c.num_key_value_heads * c.head_dim;
  return 2 * D + (Q * D + 2 * KV * D + D * Q + 3 * c.intermediate_size * D) / tp;
}

TEST(MemoryEstimate, WeightsAreTheParametersOfTheRanksStage) {
  const LlamaConfig c = tiny();  // V 264, D 64, 4 layers
  auto one = Layout::make(1, 1, 1, 0, 4);
  auto est = estimate_memory(inputs(*one));
  ASSERT_TRUE(est.ok()) << est.status().message();
  ASSERT_EQ(est->size(), 1u);
  const int64_t all = 2 * c.vocab_size * c.hidden_size + 4 * layer_params(c, 1) + c.hidden_size;
  EXPECT_EQ((*est)[0].weights, 4u * all);
  EXPECT_EQ((*est)[0].grads, 4u * all);
  EXPECT_EQ((*est)[0].optimizer, 8u * all);
  EXPECT_EQ((*est)[0].buffers, 0u);
  EXPECT_EQ((*est)[0].checkpoint, 0u);  // no run dir
  // tp 2, pp 2 [1, 3]: the vocabulary padded to a multiple of 128*2 (264 -> 512 rows, 256 per rank);
  // rank 1 holds 264 - 256 = 8 real rows.
  auto tp2 = Layout::make(2, 2, 1, 0, 4, {1, 3});
  auto e2 = estimate_memory(inputs(*tp2, 4));
  ASSERT_TRUE(e2.ok()) << e2.status().message();
  ASSERT_EQ(e2->size(), 4u);
  const int64_t D = c.hidden_size;
  EXPECT_EQ((*e2)[0].weights, 4u * (256 * D + layer_params(c, 2)));
  EXPECT_EQ((*e2)[1].weights, 4u * (8 * D + layer_params(c, 2)));
  EXPECT_EQ((*e2)[2].weights, 4u * (256 * D + 3 * layer_params(c, 2) + D));
  EXPECT_EQ((*e2)[3].weights, 4u * (8 * D + 3 * layer_params(c, 2) + D));
  // 1F1B: stage 0 keeps min(2, 4) = 2 slots, stage 1 one; the last stage adds the logits.
  EXPECT_GT((*e2)[0].activations, 0u);
  EXPECT_EQ((*e2)[0].place, (RankPlace{0, 0, 0}));
  EXPECT_EQ((*e2)[3].place, (RankPlace{0, 1, 1}));
}

TEST(MemoryEstimate, ZeroOneSplitsTheOptimizerStateOverTheDataParallelRanks) {
  auto z0 = Layout::make(1, 1, 2, 0, 4);
  auto z1 = Layout::make(1, 1, 2, 1, 4);
  auto e0 = estimate_memory(inputs(*z0));
  auto e1 = estimate_memory(inputs(*z1));
  ASSERT_TRUE(e0.ok() && e1.ok());
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ((*e0)[r].optimizer, 2 * (*e0)[r].weights);
    EXPECT_EQ((*e0)[r].buffers, (*e0)[r].grads);  // the packed gradients of the DP all-reduce
    // Each DP rank updates half of the (padded) flat buffer: within one padding block of half.
    const int64_t half = static_cast<int64_t>((*e1)[r].weights);  // = 2 moments x half the elements
    EXPECT_LE(std::abs(static_cast<int64_t>((*e1)[r].optimizer) - half), 2 * 4 * 128);
  }
}

TEST(MemoryEstimate, GeneralLayoutRanksEqualTheirStageViews) {
  // FlashFlex style: pipeline 0 [1 tp2 A | 3 tp1 B], pipeline 1 [2 tp1 B | 2 tp2 C], mb 2 and 1.
  auto l = Layout::from_pipelines({{2, {{1, 2, "A"}, {3, 1, "B"}}}, {1, {{2, 1, "B"}, {2, 2, "C"}}}}, 0);
  ASSERT_TRUE(l.ok()) << l.status().message();
  auto est = estimate_memory(inputs(*l, 3));
  ASSERT_TRUE(est.ok()) << est.status().message();
  ASSERT_EQ(static_cast<int>(est->size()), l->world_size());
  for (const RankMemory& m : *est) {
    const Layout view = l->stage_view(m.place.pipeline, m.place.stage);
    auto ve = estimate_memory(inputs(view, 3));
    ASSERT_TRUE(ve.ok()) << ve.status().message();
    const RankMemory& v = (*ve)[static_cast<size_t>(view.rank_of(m.place.stage, 0, m.place.tp_rank))];
    EXPECT_EQ(m.device, l->stage_device(m.place.pipeline, m.place.stage));
    EXPECT_EQ(m.weights, v.weights) << m.rank;
    EXPECT_EQ(m.optimizer, v.optimizer) << m.rank;
    EXPECT_EQ(m.activations, v.activations) << m.rank;
    EXPECT_EQ(m.workspace, v.workspace) << m.rank;
  }
}

TEST(MemoryEstimate, CheckNamesTheFirstRankThatDoesNotFit) {
  auto l = Layout::from_pipelines({{1, {{2, 2, "A"}, {2, 1, "B"}}}, {1, {{2, 2, "A"}, {2, 1, "B"}}}}, 0);
  ASSERT_TRUE(l.ok());
  auto est = estimate_memory(inputs(*l));
  ASSERT_TRUE(est.ok());
  // Ranks 0..3: stage 0 (A), ranks 4, 5: stage 1 (B) of pipelines 0 and 1.
  auto make = [](const std::string& b_memory) {
    return Cluster::from_json(nlohmann::json::parse(R"({"device_types":[{"name":"A","memory":"1GiB"},
        {"name":"B","memory":)" + b_memory + R"(}],"ranks":[{"type":"A","count":4},{"type":"B","count":2}]})"));
  };
  auto roomy = make("\"1GiB\"");
  ASSERT_TRUE(roomy.ok());
  ASSERT_TRUE(check_cluster_layout(*roomy, *l).ok());
  EXPECT_TRUE(check_memory(*est, *roomy).ok());
  const uint64_t need = (*est)[4].total();
  auto tight = make(std::to_string(need - 1));
  ASSERT_TRUE(tight.ok());
  Status st = check_memory(*est, *tight);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), "RankOutOfMemory");
  EXPECT_NE(st.message().find("rank 4 (pipeline 0, stage 1, tp rank 0) on device type 'B'"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("weights "), std::string::npos);
  auto exact = make(std::to_string(std::max((*est)[4].total(), (*est)[5].total())));
  EXPECT_TRUE(check_memory(*est, *exact).ok());
}

}  // namespace memory_estimate_test
}  // namespace ckpt::trainer
