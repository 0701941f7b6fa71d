// reshard/layout/layout_flagscale.h: FlagScale-style hetero configs (hetero_process_meshes,
// hetero_device_types, hetero_pipeline_layer_split) read as layout files, written the way
// FlagScale's own configs write them (examples/llama3/conf/train/8b_hetero.yaml's hetero block as
// JSON; the first releases' 4-entry meshes), against the pipelines expected by hand.
#include "reshard/layout/layout.h"

#include <gtest/gtest.h>

namespace ckpt {
namespace flagscale_test {  // named, not anonymous: unique in a unity batch

Result<Layout> parse(const char* text) { return Layout::from_json(nlohmann::json::parse(text)); }

TEST(LayoutFlagScale, FiveEntryMeshesAsFlagScaleWritesThem) {
  // FlagScale's examples/aquila/conf/train/hetero.yaml "2 mesh, diff pp and tp" (dp 1), ep = 1.
  auto l = parse(R"({"enable_hetero": true, "hetero_use_cpu_communication": false,
                     "hetero_pipeline_layer_split": [6, 2, 4],
                     "hetero_process_meshes": [2, 1, 1, 1, 2, 4, 1, 1, 1, 1],
                     "hetero_device_types": ["A800", "BI150"],
                     "hetero_current_device_type": "A800",
                     "standalone_embedding_stage": false})");
  ASSERT_TRUE(l.ok()) << l.status().message();
  ASSERT_FALSE(l->symmetric());
  ASSERT_EQ(l->num_pipelines(), 1);
  const std::vector<StageSpec> want = {{6, 2, "A800"}, {2, 2, "A800"}, {4, 4, "BI150"}};
  EXPECT_EQ(l->pipelines[0].stages, want);
  EXPECT_EQ(l->world_size(), 8);
  EXPECT_EQ(l->zero, 0);
}

TEST(LayoutFlagScale, FourEntryMeshesWithDataParallelPipelines) {
  // [tp, cp, dp, pp] per mesh (FlagScale mid 2024): mesh 0 tp 2 on two stages, mesh 1 tp 1 on one,
  // dp 2 everywhere; the Megatron rank order within each mesh, meshes one after the other.
  auto l = parse(R"({"hetero_process_meshes": [[2, 1, 2, 2], [1, 1, 2, 1]],
                     "hetero_device_types": ["A", "B"],
                     "hetero_pipeline_layer_split": [1, 2, 3],
                     "use_distributed_optimizer": true, "micro_batch_size": 2})");
  ASSERT_TRUE(l.ok()) << l.status().message();
  ASSERT_EQ(l->num_pipelines(), 2);
  for (int p = 0; p < 2; ++p) {
    EXPECT_EQ(l->pipelines[p].micro_batch, 2);
    const std::vector<StageSpec> want = {{1, 2, "A"}, {2, 2, "A"}, {3, 1, "B"}};
    EXPECT_EQ(l->pipelines[p].stages, want);
  }
  EXPECT_EQ(l->zero, 1);
  EXPECT_EQ(l->world_size(), 2 * 2 * 2 + 2);
  // Mesh 0 holds ranks 0..7 ((stage*dp + dp_rank)*tp + tp), mesh 1 ranks 8..9.
  EXPECT_EQ(l->place_of_rank(5), (RankPlace{0, 1, 1}));
  EXPECT_EQ(l->place_of_rank(9), (RankPlace{1, 2, 0}));
}

TEST(LayoutFlagScale, HeteroMicroBatchSizesArePerDataParallelRank) {
  // FlagScale's hetero_micro_batch_sizes pairs [n0, mbs0, n1, mbs1]: 2 ranks of 3, 1 rank of 1.
  auto l = parse(R"({"hetero_process_meshes": [1, 1, 3, 2], "hetero_device_types": ["A"],
                     "hetero_pipeline_layer_split": [2, 2], "hetero_micro_batch_sizes": [2, 3, 1, 1]})");
  ASSERT_TRUE(l.ok()) << l.status().message();
  ASSERT_EQ(l->num_pipelines(), 3);
  EXPECT_EQ(l->pipeline_micro_batch(0), 3);
  EXPECT_EQ(l->pipeline_micro_batch(1), 3);
  EXPECT_EQ(l->pipeline_micro_batch(2), 1);
  // The default split is FlagScale's: num_layers / stages each.
  auto d = parse(R"({"hetero_process_meshes": [1, 1, 1, 1, 1, 2, 1, 1, 1, 1], "hetero_device_types": ["A", "B"],
                     "num_layers": 4})");
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->pipelines[0].stages, (std::vector<StageSpec>{{2, 1, "A"}, {2, 2, "B"}}));
}

TEST(LayoutFlagScale, RefusesWhatCkptCannotRunNamingTheProblem) {
  auto err = [](const char* text) {
    auto r = parse(text);
    EXPECT_FALSE(r.ok()) << text;
    return r.ok() ? std::string() : r.status().code() + ": " + r.status().message();
  };
  auto has = [](const std::string& s, const std::string& n) { return s.find(n) != std::string::npos; };
  std::string e = err(R"({"hetero_process_meshes": [1,1,2,1, 1,1,1,1], "hetero_device_types": ["A","B"],
                          "hetero_pipeline_layer_split": [1,1]})");
  EXPECT_TRUE(has(e, "Unsupported") && has(e, "process mesh 1 (B) has dp=1") && has(e, "mesh 0 (A) dp=2")) << e;
  e = err(R"({"hetero_process_meshes": [1,2,1,1], "hetero_device_types": ["A"], "hetero_pipeline_layer_split": [2]})");
  EXPECT_TRUE(has(e, "cp=2")) << e;
  // A mesh's ep takes its tp x dp ranks (tests/reshard/layout_experts_test.cc): ep 2 does not fit 1 x 1.
  e = err(R"({"hetero_process_meshes": [1,1,2,1,1], "hetero_device_types": ["A"], "hetero_pipeline_layer_split": [2]})");
  EXPECT_TRUE(has(e, "BadLayout") && has(e, "ep=2 x etp=1 does not divide the 1 ranks")) << e;
  e = err(R"({"hetero_process_meshes": [1,1,1], "hetero_device_types": ["A"], "hetero_pipeline_layer_split": [2]})");
  EXPECT_TRUE(has(e, "BadLayout") && has(e, "3 entries for 1 device types")) << e;
  e = err(R"({"hetero_process_meshes": [1,1,1,2], "hetero_device_types": ["A"], "hetero_pipeline_layer_split": [2]})");
  EXPECT_TRUE(has(e, "has 1 stages, the meshes' pp sum to 2")) << e;
  e = err(R"({"hetero_process_meshes": [1,1,1,1], "hetero_pipeline_layer_split": [2]})");
  EXPECT_TRUE(has(e, "hetero_device_types")) << e;
  e = err(R"({"hetero_process_meshes": [1,1,2,1], "hetero_device_types": ["A"], "hetero_pipeline_layer_split": [2],
              "hetero_micro_batch_sizes": [1, 4]})");
  EXPECT_TRUE(has(e, "sum to 1, the meshes' dp is 2")) << e;
  e = err(R"({"hetero_process_meshes": [1,1,1,1], "hetero_device_types": ["A"], "hetero_pipeline_layer_split": [2],
              "global_batch_size": 8})");
  EXPECT_TRUE(has(e, "unknown key 'global_batch_size'")) << e;
  e = err(R"({"hetero_process_meshes": [1,1,1,1], "hetero_device_types": ["A"], "hetero_pipeline_layer_split": [2],
              "hetero_current_device_type": "C"})");
  EXPECT_TRUE(has(e, "hetero_current_device_type")) << e;
  e = err(R"({"hetero_process_meshes": [1,1,1,1], "hetero_device_types": ["A"], "hetero_pipeline_layer_split": [0]})");
  EXPECT_TRUE(has(e, "expected integers in 1..")) << e;
  // ZeRO-1 (use_distributed_optimizer) over pipelines whose stages differ cannot come from meshes
  // (every pipeline has every mesh's stages), but a layer split the model does not have is the
  // rules' business; here the pipelines are checked.
  e = err(R"({"hetero_process_meshes": [1,1,1,1], "hetero_device_types": ["A"], "hetero_pipeline_layer_split": [2],
              "num_layers": 3})");
  EXPECT_TRUE(has(e, "num_layers 3")) << e;
}

}  // namespace flagscale_test
}  // namespace ckpt
