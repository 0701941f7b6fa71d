// Megatron's interleaved (virtual pipeline) assignment, converters/megatron/megatron_vpp.h: each
// chunk's layers equal an independent restatement of megatron-core's get_transformer_layer_offset
// (vp_stage * (L / vpp) + pipeline_rank * (L / (pp * vpp))), the chunks tile the layers once, the
// plain pipeline of chunk stages runs in the forward's order, and layouts that do not divide are
// refused by name.
#include "converters/megatron/megatron_vpp.h"

#include <gtest/gtest.h>

#include <vector>

namespace ckpt {
namespace {

// Layer -> (pp_rank, chunk) as megatron-core's TransformerBlock builds it: for every pipeline rank
// and vp_stage, the layers [offset, offset + L / (pp * vpp)).
std::vector<std::pair<int, int>> reference_owner(int L, int pp, int vpp) {
  std::vector<std::pair<int, int>> owner(L, {-1, -1});
  const int per_rank = L / pp, per_chunk = per_rank / vpp, total_virtual_chunks = L / vpp;
  for (int p = 0; p < pp; ++p)
    for (int v = 0; v < vpp; ++v) {
      const int offset = v * total_virtual_chunks + p * per_chunk;
      for (int i = 0; i < per_chunk; ++i) owner[offset + i] = {p, v};
    }
  return owner;
}

TEST(MegatronVpp, ChunksMatchMegatronCoreOffsets) {
  for (int L : {4, 8, 12, 24, 32})
    for (int pp : {1, 2, 3, 4})
      for (int vpp : {1, 2, 3, 4}) {
        if (L % (pp * vpp) != 0) continue;
        const auto want = reference_owner(L, pp, vpp);
        std::vector<int> seen(L, 0);
        for (int p = 0; p < pp; ++p)
          for (int v = 0; v < vpp; ++v) {
            auto c = megatron_vpp_chunk(L, pp, vpp, p, v, "test");
            ASSERT_TRUE(c.ok()) << c.status().to_string();
            EXPECT_EQ(c->num_layers, L / (pp * vpp));
            for (int64_t l = c->first_layer; l < c->first_layer + c->num_layers; ++l) {
              ASSERT_GE(l, 0);
              ASSERT_LT(l, L);
              ++seen[l];
              EXPECT_EQ(want[l], std::make_pair(p, v)) << "L=" << L << " pp=" << pp << " vpp=" << vpp << " layer " << l;
            }
          }
        for (int l = 0; l < L; ++l) EXPECT_EQ(seen[l], 1) << "layer " << l << " L=" << L << " pp=" << pp << " vpp=" << vpp;
      }
}

TEST(MegatronVpp, Pp2Vpp2OfFourLayers) {  // the fixture's case, by hand: stage 0 = layers 0, 2; stage 1 = 1, 3
  const std::pair<int, int> at[4] = {{0, 0}, {1, 0}, {0, 1}, {1, 1}};
  for (int l = 0; l < 4; ++l) {
    auto c = megatron_vpp_chunk(4, 2, 2, at[l].first, at[l].second, "test");
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(c->first_layer, l);
  }
}

TEST(MegatronVpp, VirtualStagesRunInForwardOrder) {
  // Stage s of the plain pipeline holds layers [s * n, (s + 1) * n): chunk c of rank p is stage c * pp + p.
  for (int pp : {1, 2, 3})
    for (int vpp : {1, 2, 4}) {
      const int L = 2 * pp * vpp, n = 2;
      for (int p = 0; p < pp; ++p)
        for (int v = 0; v < vpp; ++v) {
          const int s = megatron_vpp_virtual_stage(pp, p, v);
          EXPECT_EQ(megatron_vpp_chunk(L, pp, vpp, p, v, "t")->first_layer, int64_t{s} * n);
          const VppChunk back = megatron_vpp_of_stage(pp, s);
          EXPECT_EQ(back.pp_rank, p);
          EXPECT_EQ(back.chunk, v);
        }
    }
}

TEST(MegatronVpp, LayoutOfChunkStages) {
  auto base = Layout::make(2, 2, 1, 0, 8, {});
  ASSERT_TRUE(base.ok());
  base->vocab_divisor = 64;
  auto v = megatron_vpp_layout(*base, 2, "test");
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_EQ(v->tp, 2);
  EXPECT_EQ(v->pp, 4);
  EXPECT_EQ(v->vocab_divisor, 64);
  EXPECT_EQ(v->stage_of_layer, (std::vector<int>{0, 0, 1, 1, 2, 2, 3, 3}));
}

TEST(MegatronVpp, LayersThatDoNotDivideAreRefusedByName) {
  auto s = megatron_vpp_chunk_layers(6, 2, 2, "ckpt X");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), "MegatronVppLayersNotDivisible");
  EXPECT_NE(s.status().message().find("ckpt X"), std::string::npos);
  // An uneven stage split cannot be interleaved evenly, even when the total divides.
  auto uneven = Layout::make(1, 2, 1, 0, 8, {2, 6});
  ASSERT_TRUE(uneven.ok());
  auto v = megatron_vpp_layout(*uneven, 2, "t");
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), "MegatronVppLayersNotDivisible");
  EXPECT_FALSE(megatron_vpp_chunk(8, 2, 2, 2, 0, "t").ok());  // rank out of range
  EXPECT_FALSE(megatron_vpp_chunk(8, 2, 2, 0, 2, "t").ok());  // chunk out of range
  EXPECT_FALSE(megatron_vpp_chunk_layers(8, 0, 2, "t").ok());
  // Megatron-LM runs an interleaved schedule over pp > 1 only.
  auto pp1 = Layout::make(1, 1, 1, 0, 8, {});
  ASSERT_TRUE(pp1.ok());
  auto one = megatron_vpp_layout(*pp1, 2, "t");
  ASSERT_FALSE(one.ok());
  EXPECT_EQ(one.status().code(), "MegatronVppNeedsPipeline");
  EXPECT_TRUE(megatron_vpp_layout(*pp1, 1, "t").ok());
}

TEST(MegatronVpp, ArgsNameTheVirtualPipeline) {
  nlohmann::json a = {{"num_layers", 8}, {"pipeline_model_parallel_size", 2}, {"layers_per_stage", {4, 4}}};
  EXPECT_EQ(megatron_vpp_args(a, 1), a);
  const nlohmann::json v = megatron_vpp_args(a, 2);
  EXPECT_EQ(v["virtual_pipeline_model_parallel_size"], 2);
  EXPECT_EQ(v["num_layers_per_virtual_pipeline_stage"], 2);
  EXPECT_FALSE(v.contains("layers_per_stage"));
}

}  // namespace
}  // namespace ckpt
