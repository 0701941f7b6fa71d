// The distributed optimizer's buffers as the export writes them (converters/megatron/dist_optim_group.h,
// converters/megatron/megatron_dist_opt_export.h), for the model of the committed megatron-core 0.19.2
// fixture fixtures/megatron_core_019/distopt_dp_reshardable (tp 2, dp 2, bucket size 2048): the
// flat segments of each bucket tile exactly the numel_unpadded megatron-core recorded (2048, 2112,
// 2048, 3072) with the padded sizes (2048, 2176, 2048, 3072), the zero runs are the 64-element
// alignment gaps, every parameter's canonical boxes appear once per group and state, and the args
// the export records give the import the same layout. Plus the export's named errors.
#include "converters/megatron/megatron_dist_opt_export.h"

#include <gtest/gtest.h>

#include <map>

#include "converters/megatron/megatron_torch_optim.h"
#include "reshard/memory_io.h"

namespace ckpt {
namespace {

LlamaConfig fixture_config() {
  LlamaConfig c;
  c.vocab_size = 200;
  c.hidden_size = 16;
  c.intermediate_size = 32;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 4;
  c.tie_word_embeddings = false;
  return c;
}

Layout tp2() {
  auto l = Layout::make(2, 1, 1, 0, 4);
  EXPECT_TRUE(l.ok());
  Layout out = *l;
  out.vocab_divisor = 128;
  return out;
}

TEST(DistOptGroupBuffers, BucketsTileWhatMegatronCoreRecorded) {
  MegatronDistOptOptions o{true, 2, 2048};
  const nlohmann::json args = dist_opt_args(o, 2, 1, {{"lr", 1e-3}});
  auto groups = dist_opt_buffers(fixture_config(), tp2(), args, false, "test");
  ASSERT_TRUE(groups.ok()) << groups.status().message();
  ASSERT_EQ(groups->size(), 2u);
  for (const auto& g : *groups) {
    EXPECT_EQ(g.numel, (std::vector<int64_t>{2048, 2176, 2048, 3072}));
    EXPECT_EQ(g.numel_unpadded, (std::vector<int64_t>{2048, 2112, 2048, 3072}));
    std::map<std::string, int64_t> elems;  // canonical tensor -> elements over the buckets
    for (const auto& [state, buckets] : g.states) {
      ASSERT_EQ(buckets.size(), 4u);
      for (size_t b = 0; b < buckets.size(); ++b) {
        int64_t n = 0, zeros = 0;
        for (const auto& sg : buckets[b]) {
          EXPECT_TRUE(sg.flat);
          n += sg.rows();
          if (sg.tensor.empty()) zeros += sg.zero_rows;
          else if (state == "exp_avg") elems[sg.tensor] += sg.box.numel();
          if (!sg.tensor.empty()) {
            const bool moment = sg.tensor.rfind("optimizer.", 0) == 0;
            EXPECT_EQ(moment, state != "param") << sg.tensor;  // masters are the fp32 weights here
          }
        }
        EXPECT_EQ(n, g.numel_unpadded[b]) << state << " bucket " << b;
        if (b > 0 && b < 3) {
          EXPECT_EQ(zeros % 16, 0) << "alignment gaps after 16-element norms are 48 elements";
        }
      }
    }
    // every weight's TP shard once: the norms whole, the vocab-parallel tensors' real rows
    EXPECT_EQ(elems["optimizer.exp_avg.model.norm.weight"], 16);
    EXPECT_EQ(elems["optimizer.exp_avg.model.layers.3.input_layernorm.weight"], 16);
    EXPECT_EQ(elems["optimizer.exp_avg.lm_head.weight"], g.tp_rank == 0 ? 128 * 16 : 72 * 16);
    EXPECT_EQ(elems["optimizer.exp_avg.model.layers.0.mlp.down_proj.weight"], 16 * 16);
  }
  // The import derives its layout from these args: the same settings.
  auto s = dist_optim_settings(args, 0, 0, "test");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->dp, 2);
  EXPECT_EQ(s->bucket_size, std::optional<int64_t>(2048));
}

TEST(DistOptGroupBuffers, LionKeepsOneMomentAndLionArgs) {
  MegatronDistOptOptions o{true, 2, 2048};
  const nlohmann::json args = dist_opt_args(o, 2, 1, {{"optimizer", "lion"}, {"beta1", 0.95}, {"beta2", 0.98}, {"lr", 1e-3}});
  EXPECT_EQ(args["optimizer"], "lion");
  EXPECT_EQ(args["lion_beta1"], 0.95);
  EXPECT_EQ(args["lion_beta2"], 0.98);
  EXPECT_FALSE(args.contains("adam_beta1"));
  auto groups = dist_opt_buffers(fixture_config(), tp2(), args, false, "test");
  ASSERT_TRUE(groups.ok()) << groups.status().message();
  for (const auto& g : *groups) {
    EXPECT_TRUE(g.states.count("param") && g.states.count("exp_avg"));
    EXPECT_FALSE(g.states.count("exp_avg_sq"));
  }
}

TEST(DistOptGroupBuffers, FirstBucketOpensWithOutputLayerAndVocabPaddingIsZeros) {
  MegatronDistOptOptions o{true, 2, 2048};
  auto groups = dist_opt_buffers(fixture_config(), tp2(), dist_opt_args(o, 2, 1, {}), true, "test");
  ASSERT_TRUE(groups.ok());
  const auto& b0 = (*groups)[1].states.at("param")[0];  // TP rank 1: vocab rows 128..255, 200.. padding
  ASSERT_EQ(b0.size(), 2u);
  EXPECT_EQ(b0[0].tensor, "optimizer.fp32_param.lm_head.weight");  // with masters in the source
  EXPECT_EQ(b0[0].box.offset, (Shape{128, 0}));
  EXPECT_TRUE(b0[1].tensor.empty());
  EXPECT_EQ(b0[1].zero_rows, 56 * 16);
}

TEST(DistOptGroupBuffers, NoBucketSizeIsOneBucket) {
  auto groups = dist_opt_buffers(fixture_config(), tp2(), dist_opt_args(MegatronDistOptOptions{true, 3, std::nullopt}, 2, 1, {}),
                                 false, "test");
  ASSERT_TRUE(groups.ok());
  ASSERT_EQ((*groups)[0].numel.size(), 1u);
  EXPECT_EQ((*groups)[0].numel[0] % 384, 0);  // padded to lcm(3, 128)
}

TEST(DistOptGroupBuffers, BadDpIsNamed) {
  auto groups = dist_opt_buffers(fixture_config(), tp2(), dist_opt_args(MegatronDistOptOptions{true, 0, 2048}, 2, 1, {}),
                                 false, "test");
  ASSERT_FALSE(groups.ok());
  EXPECT_EQ(groups.status().code(), "BadDistOptimArgs");
}

// A source listing the fixture model's weights and the optimizer kinds `prefixes` (no data: the
// checks read the listing and the metadata only).
MemorySource listing(const std::vector<std::string>& prefixes, nlohmann::json meta) {
  MemoryCheckpoint m;
  for (const TensorMeta& t : llama_model_tensors(fixture_config(), DType::kF32)) {
    m.tensors.push_back(t);
    for (const auto& p : prefixes) m.tensors.push_back(TensorMeta{p + t.name, DType::kF32, t.shape});
  }
  m.metadata = std::move(meta);
  return MemorySource(std::move(m));
}

TEST(DistOptExportChecks, OneNamedErrorPerRule) {
  const nlohmann::json step = {{"megatron", {{"optimizer_step", 2}}}};
  const std::vector<std::string> both = {kMegatronOptimPrefixes[0], kMegatronOptimPrefixes[1]};
  auto code = [](const Result<DistOptSourceState>& r) { return r.ok() ? std::string("ok") : r.status().code(); };
  EXPECT_EQ(code(check_dist_opt_source(listing(both, step), {true, 0, 2048}, true)), "DistOptBadFlag");
  EXPECT_EQ(code(check_dist_opt_source(listing(both, step), {true, 2, 0}, true)), "DistOptBadFlag");
  EXPECT_EQ(code(check_dist_opt_source(listing(both, step), {true, 2, 2048, "fully_sharded_model_space"}, true)),
            "UnsupportedDistOptim");
  EXPECT_EQ(code(check_dist_opt_source(listing(both, step), {true, 2, 2048}, false)), "DistOptNeedsLocalSpec");
  EXPECT_EQ(code(check_dist_opt_source(listing({}, step), {true, 2, 2048}, true)), "DistOptNoOptimizerState");
  EXPECT_EQ(code(check_dist_opt_source(listing({kMegatronOptimPrefixes[1]}, step), {true, 2, 2048}, true)),
            "MegatronOptimizerMissingMoment");
  EXPECT_EQ(code(check_dist_opt_source(listing(both, nlohmann::json::object()), {true, 2, 2048}, true)), "DistOptNoStep");
  auto no_masters = check_dist_opt_source(listing(both, step), {true, 2, 2048}, true);
  ASSERT_TRUE(no_masters.ok());
  EXPECT_FALSE(no_masters->fp32_masters);
  EXPECT_EQ(no_masters->optimizer, "adam");
  // One moment: Lion's only where the source records args.optimizer 'lion' (no step needed)
  const nlohmann::json lion = {{"megatron_args", {{"optimizer", "lion"}}}};
  EXPECT_EQ(code(check_dist_opt_source(listing({kMegatronOptimPrefixes[0]}, step), {true, 2, 2048}, true)),
            "MegatronOneMomentExport");
  EXPECT_EQ(code(check_dist_opt_source(listing({kMegatronOptimPrefixes[0]}, {{"megatron_args", {{"optimizer", "sgd"}}}}),
                                       {true, 2, 2048}, true)),
            "MegatronOneMomentExport");
  EXPECT_EQ(code(check_dist_opt_source(listing({kMegatronOptimPrefixes[0]}, lion), {true, 2, std::nullopt, "fully_reshardable"},
                                       true)),
            "ok");
  auto l = check_dist_opt_source(listing({kMegatronOptimPrefixes[0]}, lion), {true, 2, 2048}, true);
  ASSERT_TRUE(l.ok()) << l.status().message();
  EXPECT_EQ(l->optimizer, "lion");
  auto masters = check_dist_opt_source(listing({kMegatronOptimPrefixes[0], kMegatronOptimPrefixes[1], kMegatronOptimPrefixes[2]},
                                               {{"trainer", {{"step", 5}}}}),
                                       {true, 2, std::nullopt, "fully_reshardable"}, true);
  ASSERT_TRUE(masters.ok()) << masters.status().message();
  EXPECT_TRUE(masters->fp32_masters);
}

}  // namespace
}  // namespace ckpt
