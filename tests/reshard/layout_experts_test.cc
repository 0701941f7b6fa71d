// Per-stage expert parallelism in the general form of reshard/layout/layout.h (StageSpec::ep, etp;
// docs/MOE.md "General layouts"): JSON and text round trips, the canonical forms (etp = tp stored
// as 0, symmetric pipelines with one ep/etp everywhere read as the symmetric form), what a stage
// view carries, when pipelines are uniform, and one test per validation rule. FlagScale's mesh ep
// and expert_tensor_parallel_size(_per_process_mesh) keys at the end.
#include <gtest/gtest.h>

#include "reshard/layout/layout.h"
#include "reshard/layout/layout_flagscale.h"

namespace ckpt {
namespace layout_experts_test {  // named, not anonymous: unique in a unity batch

StageSpec stage(int layers, int tp, const std::string& dev, int ep = 1, int etp = 0) { return {layers, tp, dev, ep, etp}; }
PipelineSpec pipe(int mb, std::vector<StageSpec> st) { return PipelineSpec{mb, std::move(st)}; }

Result<Layout> general(std::vector<PipelineSpec> pls, int zero = 0) { return Layout::from_pipelines(std::move(pls), zero); }

// Two uniform pipelines: stage 0 at tp 2 ep 2 etp 1 on A, stage 1 at tp 1 ep 2 on B.
std::vector<PipelineSpec> uniform_ep() {
  return {pipe(2, {stage(1, 2, "A", 2, 1), stage(2, 1, "B", 2)}), pipe(1, {stage(1, 2, "A", 2, 1), stage(2, 1, "B", 2)})};
}

TEST(LayoutExperts, JsonAndTextRoundTripKeepPerStageEpEtp) {
  auto l = general(uniform_ep(), 1);
  ASSERT_TRUE(l.ok()) << l.status().message();
  ASSERT_FALSE(l->symmetric());
  EXPECT_TRUE(l->expert_parallel());
  const nlohmann::json j = l->to_json();
  const nlohmann::json& s0 = j.at("pipelines")[0].at("stages")[0];
  EXPECT_EQ(s0.at("ep"), 2);
  EXPECT_EQ(s0.at("etp"), 1);
  EXPECT_EQ(j.at("pipelines")[0].at("stages")[1].at("etp"), 1);  // etp = tp written out when the stage is expert parallel
  auto back = Layout::from_json(j);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->pipelines, l->pipelines);
  EXPECT_EQ(back->to_json(), j);
  EXPECT_EQ(l->to_string(), "2 pipelines: mb=2 [1 tp2 ep2 etp1 A | 2 tp1 ep2 B], mb=1 [1 tp2 ep2 etp1 A | 2 tp1 ep2 B] zero=1");
  // A dense stage writes neither key: the JSON of a layout without experts is unchanged.
  auto dense = general({pipe(1, {stage(2, 2, "A")})});
  ASSERT_TRUE(dense.ok());
  EXPECT_FALSE(dense->expert_parallel());
  EXPECT_FALSE(dense->to_json().at("pipelines")[0].at("stages")[0].contains("ep"));
}

TEST(LayoutExperts, EtpEqualToTpIsStoredAsZero) {
  auto l = general({pipe(1, {stage(2, 2, "A", 2, 2)}), pipe(1, {stage(2, 2, "B", 2, 2)})});  // 4 ranks: ep 2 x etp 2
  ASSERT_TRUE(l.ok()) << l.status().message();
  EXPECT_EQ(l->pipelines[0].stages[0].etp, 0);
  EXPECT_EQ(l->stage_expert_tp(0, 0), 2);
  EXPECT_EQ(l->pipelines, general({pipe(1, {stage(2, 2, "A", 2)}), pipe(1, {stage(2, 2, "B", 2)})})->pipelines);
}

TEST(LayoutExperts, OneEpEtpEverywhereWithoutDevicesIsTheSymmetricForm) {
  auto l = general({pipe(1, {stage(1, 2, "", 2, 1), stage(1, 2, "", 2, 1)}), pipe(1, {stage(1, 2, "", 2, 1), stage(1, 2, "", 2, 1)})});
  ASSERT_TRUE(l.ok()) << l.status().message();
  ASSERT_TRUE(l->symmetric());
  EXPECT_EQ(l->ep, 2);
  EXPECT_EQ(l->expert_tp(), 1);
  EXPECT_EQ(l->dp, 2);
  // Per-stage ep keeps the general form, and as_symmetric names it.
  auto g = general({pipe(1, {stage(1, 2, "", 2, 1), stage(1, 2, "", 1)})});
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_FALSE(g->symmetric());
  auto s = g->as_symmetric("the Megatron export");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), "Unsupported");
}

TEST(LayoutExperts, StageViewCarriesTheStagesEpEtp) {
  auto l = general(uniform_ep());
  ASSERT_TRUE(l.ok());
  ASSERT_TRUE(l->uniform_pipelines());
  const Layout v0 = l->stage_view(1, 0), v1 = l->stage_view(0, 1);
  EXPECT_EQ(v0.tp, 2);
  EXPECT_EQ(v0.dp, 2);  // uniform: the experts spread over both pipelines' ranks of the stage
  EXPECT_EQ(v0.ep, 2);
  EXPECT_EQ(v0.expert_tp(), 1);
  EXPECT_EQ(v1.tp, 1);
  EXPECT_EQ(v1.ep, 2);
  EXPECT_EQ(v1.expert_tp(), 1);
  EXPECT_TRUE(v0.validate().ok());
  EXPECT_TRUE(v1.validate().ok());
  EXPECT_EQ(l->stage_ep(0, 1), 2);
  // Pipelines differing only in ep are not uniform: each stage's experts over its own tp ranks.
  auto n = general({pipe(1, {stage(2, 2, "A", 2, 1)}), pipe(1, {stage(2, 2, "B", 1)})});
  ASSERT_TRUE(n.ok()) << n.status().message();
  EXPECT_FALSE(n->uniform_pipelines());
  EXPECT_EQ(n->stage_view(0, 0).dp, 1);
  EXPECT_EQ(n->stage_view(0, 0).ep, 2);
  EXPECT_EQ(n->stage_view(1, 0).ep, 1);
  EXPECT_TRUE(n->expert_parallel());
}

void expect_code(const Result<Layout>& r, const std::string& code, const std::string& needle) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), code) << r.status().message();
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
}

// Validation: one test per rule.
TEST(LayoutExpertsValidate, EpTimesEtpMustDivideTheViewsRanks) {
  // Non-uniform pipelines: a stage's own tp ranks (tp 2 cannot hold ep 4).
  expect_code(general({pipe(1, {stage(2, 2, "A", 4, 1)}), pipe(1, {stage(2, 1, "B")})}), "BadLayout",
              "pipeline 0 stage 0: ep=4 x etp=1 does not divide the 2 ranks holding its experts (tp=2 x dp=1)");
  // Uniform pipelines: the stage's tp x pipelines ranks (2 x 2 take ep 4, not ep 4 x etp 2).
  EXPECT_TRUE(general({pipe(1, {stage(2, 2, "A", 4, 1)}), pipe(1, {stage(2, 2, "B", 4, 1)})}).ok());
  expect_code(general({pipe(1, {stage(2, 2, "A", 4, 2)}), pipe(1, {stage(2, 2, "B", 4, 2)})}), "BadLayout",
              "ep=4 x etp=2 does not divide the 4 ranks");
}
TEST(LayoutExpertsValidate, EpAndEtpInRange) {
  expect_code(general({pipe(1, {stage(2, 2, "A", 0)})}), "BadLayout", "pipeline 0 stage 0 has ep 0 and etp 0");
  expect_code(general({pipe(1, {stage(2, 2, "A", 1, -1)})}), "BadLayout", "expected ep >= 1 and etp >= 0");
  expect_code(Layout::from_json(nlohmann::json::parse(R"({"pipelines":[{"stages":[{"layers":2,"tp":2,"etp":0}]}]})")),
              "BadLayout", "key 'etp' is 0");
}
TEST(LayoutExpertsValidate, ZeroOneNeedsTheSameEpEtpOnEachStage) {
  expect_code(general({pipe(1, {stage(2, 2, "A", 2, 1)}), pipe(1, {stage(2, 2, "B", 1)})}, 1), "BadLayout",
              "stage 0 of pipeline 0 holds 2 layers at tp 2 ep 2 etp 1, of pipeline 1 2 layers at tp 2");
  expect_code(general({pipe(1, {stage(2, 2, "A", 1, 1)}), pipe(1, {stage(2, 2, "B", 1, 2)})}, 1), "BadLayout",
              "tp 2 ep 1 etp 1, of pipeline 1");
  EXPECT_TRUE(general({pipe(1, {stage(2, 2, "A", 2, 1)}), pipe(1, {stage(2, 2, "B", 1)})}, 0).ok());  // zero 0: allowed
}
TEST(LayoutExpertsValidate, EpForAWholeLayoutOrPipelineIsRefusedByName) {
  for (const char* text : {R"({"pipelines":[{"stages":[{"layers":2,"tp":2}]}],"ep":2})",
                           R"({"pipelines":[{"etp":1,"stages":[{"layers":2,"tp":2}]}]})"})
    expect_code(Layout::from_json(nlohmann::json::parse(text)), "LayoutUnsupported", "give ep and etp per stage");
  Layout l = *general({pipe(1, {stage(2, 2, "A")})});
  l.ep = 2;
  EXPECT_EQ(l.validate().code(), "LayoutUnsupported");
}

Result<Layout> flagscale(const char* text) { return layout_from_flagscale(nlohmann::json::parse(text)); }

TEST(LayoutExpertsFlagScale, MeshEpAndExpertTensorParallelSizes) {
  // Two meshes [tp, cp, ep, dp, pp]: A at tp 2 ep 2 dp 2, B at tp 1 ep 2 dp 2; etp per mesh 1, 1.
  auto l = flagscale(R"({"hetero_process_meshes": [2, 1, 2, 2, 1, 1, 1, 2, 2, 1], "hetero_device_types": ["A", "B"],
                         "hetero_pipeline_layer_split": [1, 2], "expert_tensor_parallel_size_per_process_mesh": [1, 1],
                         "use_distributed_optimizer": true})");
  ASSERT_TRUE(l.ok()) << l.status().message();
  const auto want = general(uniform_ep(), 1);
  ASSERT_TRUE(want.ok());
  ASSERT_EQ(l->num_pipelines(), 2);
  for (int p = 0; p < 2; ++p) EXPECT_EQ(l->pipelines[p].stages, want->pipelines[p].stages);
  EXPECT_EQ(l->zero, 1);
  // One expert_tensor_parallel_size for every mesh; none: etp = the mesh's tp.
  auto one = flagscale(R"({"hetero_process_meshes": [2, 1, 2, 2, 1, 1, 1, 1, 2, 1], "hetero_device_types": ["A", "B"],
                           "hetero_pipeline_layer_split": [1, 2], "expert_tensor_parallel_size": 1})");
  ASSERT_TRUE(one.ok()) << one.status().message();
  EXPECT_EQ(one->stage_expert_tp(0, 0), 1);
  EXPECT_EQ(one->stage_ep(0, 1), 1);
  auto none = flagscale(R"({"hetero_process_meshes": [2, 1, 2, 2, 1], "hetero_device_types": ["A"],
                            "hetero_pipeline_layer_split": [2]})");
  ASSERT_TRUE(none.ok()) << none.status().message();
  EXPECT_EQ(none->stage_expert_tp(1, 0), 2);
  EXPECT_EQ(none->stage_ep(1, 0), 2);
}
TEST(LayoutExpertsFlagScale, ExpertSizesRefusedByName) {
  expect_code(flagscale(R"({"hetero_process_meshes": [2, 1, 2, 1, 1, 1, 1, 1, 1, 1], "hetero_device_types": ["A", "B"],
                            "hetero_pipeline_layer_split": [1, 1], "expert_tensor_parallel_size_per_process_mesh": [1]})"),
              "BadLayout", "has 1 entries for 2 process meshes");
  expect_code(flagscale(R"({"hetero_process_meshes": [2, 1, 2, 1, 1], "hetero_device_types": ["A"],
                            "hetero_pipeline_layer_split": [2], "expert_tensor_parallel_size": "1"})"),
              "BadLayout", "'expert_tensor_parallel_size' must be an integer");
  expect_code(flagscale(R"({"hetero_process_meshes": [1, 1, 2, 1, 1], "hetero_device_types": ["A"],
                            "hetero_pipeline_layer_split": [2]})"),
              "BadLayout", "ep=2 x etp=1 does not divide the 1 ranks");
}

}  // namespace layout_experts_test
}  // namespace ckpt
