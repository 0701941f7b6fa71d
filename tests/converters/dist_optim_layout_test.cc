// The distributed optimizer's bucket layout (converters/megatron/dist_optim_layout.h): one
// test per rule (R1..R5, S1..S3, C1..C3, M1), and the layout megatron-core 0.19.2 itself made for the
// committed fixture fixtures/megatron_core_019/distopt_dp_reshardable (optimizer_oracle_tp0.json:
// 4 buckets of 2048, 2112 (padded 2176), 2048, 3072 elements).
#include "converters/megatron/dist_optim_layout.h"

#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

namespace ckpt {
namespace {

DistOptimSettings settings(int64_t dp, std::optional<int64_t> bucket) {
  DistOptimSettings s;
  s.dp = dp;
  s.bucket_size = bucket;
  return s;
}

TEST(DistOptimLayout, R1ReverseOrder) {
  auto l = dist_optim_layout({{"a", 128}, {"b", 64}}, settings(1, std::nullopt));
  ASSERT_TRUE(l.ok()) << l.status().message();
  ASSERT_EQ(l->params.size(), 2u);
  EXPECT_EQ(l->params[0].name, "b");
  EXPECT_EQ(l->params[0].start, 0);
  EXPECT_EQ(l->params[1].name, "a");
  EXPECT_EQ(l->params[1].start, 64);
}

TEST(DistOptimLayout, R2StartsAlignedTo64) {
  auto l = dist_optim_layout({{"a", 10}, {"b", 16}}, settings(1, std::nullopt));
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->params[0].end, 16);
  EXPECT_EQ(l->params[1].start, 64);
  EXPECT_EQ(l->params[1].end, 74);
}

TEST(DistOptimLayout, R3BucketClosesAtBucketSize) {
  auto l = dist_optim_layout({{"a", 100}, {"b", 100}, {"c", 100}}, settings(1, 150));
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->buckets.size(), 2u);  // c, b (end 228 >= 150) | a
  EXPECT_EQ(l->params[1].bucket, 0u);
  EXPECT_EQ(l->params[2].bucket, 1u);
  EXPECT_EQ(l->params[2].start, 256);  // the next bucket starts at the padded end
}

TEST(DistOptimLayout, R3SharedEmbeddingGetsItsOwnBucket) {
  std::vector<DistOptimParam> p{{"emb", 32, true}, {"x", 16}, {"y", 16}};
  auto l = dist_optim_layout(p, settings(1, std::nullopt));
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->buckets.size(), 2u);
  EXPECT_EQ(l->params[2].name, "emb");
  EXPECT_EQ(l->params[2].bucket, 1u);
  EXPECT_EQ(l->params[2].start, 128);
}

TEST(DistOptimLayout, R4BucketEndsPaddedToLcmOfDpAnd128) {
  auto l = dist_optim_layout({{"a", 100}}, settings(3, std::nullopt));
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->buckets[0].end, 384);  // lcm(3, 128) = 384
  DistOptimSettings s = settings(2, std::nullopt);
  s.pad_for_high_nccl_busbw = true;
  l = dist_optim_layout({{"a", 100}}, s);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->buckets[0].end, 65536);
}

TEST(DistOptimLayout, R5NumelUnpaddedIsTheLastEnd) {
  auto l = dist_optim_layout({{"a", 10}, {"b", 16}}, settings(2, std::nullopt));
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->buckets[0].numel_unpadded, 74);
  EXPECT_EQ(l->buckets[0].end, 128);
}

TEST(DistOptimLayout, BadInputIsNamed) {
  EXPECT_EQ(dist_optim_layout({{"a", 0}}, settings(1, std::nullopt)).status().code(), "BadDistOptimArgs");
  EXPECT_EQ(dist_optim_layout({{"a", 1}}, settings(0, std::nullopt)).status().code(), "BadDistOptimArgs");
  EXPECT_EQ(dist_optim_layout({{"a", 1}}, settings(1, 0)).status().code(), "BadDistOptimArgs");
}

TEST(DistOptimSettings, S1DataParallelSize) {
  auto s = dist_optim_settings({{"data_parallel_size", 2}, {"context_parallel_size", 2}}, 0, 0, "f");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->dp, 4);
  s = dist_optim_settings({{"world_size", 8}, {"tensor_model_parallel_size", 2}}, 0, 0, "f");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->dp, 4);
  EXPECT_EQ(dist_optim_settings(nlohmann::json::object(), 0, 0, "f").status().code(), "BadDistOptimArgs");
}

TEST(DistOptimSettings, S2BucketSize) {
  nlohmann::json a{{"data_parallel_size", 2}, {"overlap_grad_reduce", true}, {"ddp_bucket_size", 2048}};
  auto s = dist_optim_settings(a, 0, 0, "f");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->bucket_size, 2048);
  EXPECT_FALSE(dist_optim_settings(a, 1, 0, "f")->bucket_size);  // a later pipeline stage: one bucket
  EXPECT_FALSE(dist_optim_settings(a, 0, 1, "f")->bucket_size);  // a later model chunk: one bucket
  a["ddp_bucket_size"] = nullptr;
  EXPECT_EQ(dist_optim_settings(a, 0, 0, "f")->bucket_size, 40000000);
  a["data_parallel_size"] = 64;
  EXPECT_EQ(dist_optim_settings(a, 0, 0, "f")->bucket_size, 64000000);
  a["overlap_grad_reduce"] = false;
  EXPECT_FALSE(dist_optim_settings(a, 0, 0, "f")->bucket_size);
  a["overlap_grad_reduce"] = true;
  a["ddp_bucket_size"] = -1;
  EXPECT_EQ(dist_optim_settings(a, 0, 0, "f").status().code(), "BadDistOptimArgs");
}

TEST(DistOptimSettings, S3SeveralInstancesUnsupported) {
  nlohmann::json a{{"data_parallel_size", 2}, {"num_distributed_optimizer_instances", 2}};
  EXPECT_EQ(dist_optim_settings(a, 0, 0, "f").status().code(), "UnsupportedDistOptim");
}

TEST(DistOptimCheck, C1C2C3) {
  auto l = dist_optim_layout({{"a", 100}, {"b", 100}, {"c", 100}}, settings(1, 150));
  ASSERT_TRUE(l.ok());  // buckets: 228 (padded 256), 100 (padded 128)
  EXPECT_TRUE(check_dist_optim_buckets(*l, {228, 100}, "w").ok());
  EXPECT_EQ(check_dist_optim_buckets(*l, {228}, "w").code(), "DistOptimBucketCount");
  EXPECT_EQ(check_dist_optim_buckets(*l, {300, 100}, "w").code(), "DistOptimPastBuffer");
  EXPECT_EQ(check_dist_optim_buckets(*l, {200, 100}, "w").code(), "DistOptimBucketMismatch");
}

// megatron-core 0.19.2's own layout of TP rank 0 of the fixture (tp 2, dp 2, bucket size 2048).
TEST(DistOptimLayout, EqualsMegatronCoreOnTheFixture) {
  const int64_t h = 16, tp = 2;
  std::vector<DistOptimParam> p{{"embedding", 256 / tp * h}};
  for (int l = 0; l < 4; ++l)
    for (int64_t n : {h, h * 16 / tp, (16 + 16) / tp * h, h, 2 * 32 / tp * h, h * 32 / tp})
      p.push_back({"layer" + std::to_string(l), n});
  p.push_back({"final_layernorm", h});
  p.push_back({"output_layer", 256 / tp * h});
  auto l = dist_optim_layout(p, settings(2, 2048));
  ASSERT_TRUE(l.ok());
  ASSERT_EQ(l->buckets.size(), 4u);
  const int64_t unpadded[] = {2048, 2112, 2048, 3072}, padded[] = {2048, 2176, 2048, 3072};
  for (size_t b = 0; b < 4; ++b) {
    EXPECT_EQ(l->buckets[b].numel_unpadded, unpadded[b]) << b;
    EXPECT_EQ(l->buckets[b].end - l->buckets[b].start, padded[b]) << b;
  }
  EXPECT_EQ(l->params[1].start, 2048);   // decoder.final_layernorm.weight
  EXPECT_EQ(l->params[2].start, 2112);   // decoder.layers.3.mlp.linear_fc2.weight
  EXPECT_EQ(l->params.back().start, 7296);  // embedding.word_embeddings.weight
  EXPECT_EQ(l->params.back().bucket, 3u);
}

TEST(DistOptimMoments, M1MomentsFollowArgsOptimizer) {
  auto has = [](std::set<std::string> s) { return [s](const std::string& m) { return s.count(m) > 0; }; };
  const nlohmann::json adam = {{"optimizer", "adam"}}, lion = {{"optimizer", "lion"}}, none = nlohmann::json::object();
  EXPECT_TRUE(check_dist_optim_moments(adam, has({"exp_avg", "exp_avg_sq"}), "f", "f").ok());
  EXPECT_TRUE(check_dist_optim_moments(lion, has({"exp_avg"}), "f", "f").ok());
  EXPECT_TRUE(check_dist_optim_moments(none, has({"exp_avg", "exp_avg_sq"}), "f", "f").ok());  // no optimizer: Adam's
  for (const auto& [args, states, missing] :
       std::vector<std::tuple<nlohmann::json, std::set<std::string>, std::string>>{
           {adam, {"exp_avg"}, "'exp_avg_sq'"}, {none, {"exp_avg"}, "'exp_avg_sq'"}, {lion, {}, "'exp_avg'"},
           {adam, {"exp_avg_sq"}, "'exp_avg'"}}) {
    const Status st = check_dist_optim_moments(args, has(states), "'x/distrib_optim.pt'", "x/distrib_optim.pt");
    ASSERT_FALSE(st.ok()) << args.dump();
    EXPECT_EQ(st.code(), "MissingDistOptimState");
    EXPECT_NE(st.message().find(missing), std::string::npos) << st.message();
  }
}

}  // namespace
}  // namespace ckpt
