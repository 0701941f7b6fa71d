// reshard/layout/layout.h, the general form (layout_general.cc): JSON round trips, the canonical form of
// symmetric pipelines, rank_of / place_of_rank (inverse of each other, equal to the Megatron
// formula on symmetric layouts, and against a naive enumeration of the rank-order rule on random
// asymmetric layouts), stage_view, as_symmetric, and one test per validation error.
#include "reshard/layout/layout.h"

#include <gtest/gtest.h>

#include <random>

namespace ckpt {
namespace layout_test {  // named, not anonymous: unique in a unity batch

PipelineSpec pipe(int mb, std::vector<StageSpec> st) { return PipelineSpec{mb, std::move(st)}; }

Layout general(std::vector<PipelineSpec> pls, int zero = 0) {
  auto r = Layout::from_pipelines(std::move(pls), zero);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? *r : Layout{};
}

// FlashFlex style: two pipelines with different splits and per-stage tp, three device types.
Layout flashflex() {
  return general({pipe(3, {{1, 2, "A"}, {2, 1, "B"}, {3, 1, "C"}}), pipe(1, {{4, 1, "B"}, {2, 2, "A"}})});
}

TEST(LayoutGeneral, JsonRoundTripKeepsEveryField) {
  const Layout l = flashflex();
  ASSERT_FALSE(l.symmetric());
  const nlohmann::json j = l.to_json();
  EXPECT_EQ(j.at("num_layers"), 6);
  EXPECT_EQ(j.at("rank_order"), "tp-dp-pp");
  auto back = Layout::from_json(j);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->pipelines, l.pipelines);
  EXPECT_EQ(back->to_json(), j);
  EXPECT_EQ(l.to_string(), "2 pipelines: mb=3 [1 tp2 A | 2 tp1 B | 3 tp1 C], mb=1 [4 tp1 B | 2 tp2 A] zero=0");
  // The symmetric form round-trips in its own keys (format v1: tp, pp, dp, ...).
  auto sym = Layout::make(2, 3, 2, 1, 7, {2, 3, 2});
  ASSERT_TRUE(sym.ok());
  auto sb = Layout::from_json(sym->to_json());
  ASSERT_TRUE(sb.ok());
  EXPECT_EQ(sb->stage_of_layer, sym->stage_of_layer);
  EXPECT_EQ(sb->to_json(), sym->to_json());
}

TEST(LayoutGeneral, SymmetricPipelinesWithoutDevicesBecomeTheSymmetricForm) {
  const Layout l = general({pipe(1, {{2, 2, ""}, {1, 2, ""}}), pipe(1, {{2, 2, ""}, {1, 2, ""}})}, 1);
  ASSERT_TRUE(l.symmetric());
  EXPECT_EQ(l.tp, 2);
  EXPECT_EQ(l.pp, 2);
  EXPECT_EQ(l.dp, 2);
  EXPECT_EQ(l.zero, 1);
  EXPECT_EQ(l.stage_of_layer, (std::vector<int>{0, 0, 1}));
  EXPECT_TRUE(l.micro_batch.empty());  // all 1
  // Micro-batch sizes that differ are kept in the symmetric form.
  const Layout m = general({pipe(3, {{3, 1, ""}}), pipe(2, {{3, 1, ""}})});
  ASSERT_TRUE(m.symmetric());
  EXPECT_EQ(m.micro_batch, (std::vector<int>{3, 2}));
  // A device name, a per-stage tp or another split keeps the general form.
  EXPECT_FALSE(general({pipe(1, {{2, 2, "A"}, {1, 2, ""}}), pipe(1, {{2, 2, ""}, {1, 2, ""}})}).symmetric());
  EXPECT_FALSE(general({pipe(1, {{2, 2, ""}, {1, 1, ""}})}).symmetric());
  EXPECT_FALSE(general({pipe(1, {{2, 1, ""}, {1, 1, ""}}), pipe(1, {{1, 1, ""}, {2, 1, ""}})}).symmetric());
  // The JSON of the general form that names a symmetric layout reads as the symmetric form.
  auto j = Layout::from_json(nlohmann::json::parse(
      R"({"pipelines":[{"stages":[{"layers":2,"tp":2},{"layers":2,"tp":2}]}],"zero":0})"));
  ASSERT_TRUE(j.ok()) << j.status().message();
  EXPECT_TRUE(j->symmetric());
}

// The rank-order rule written out: for every stage index, every pipeline having it, its tp ranks.
std::vector<RankPlace> naive_ranks(const Layout& l) {
  std::vector<RankPlace> out;
  for (int s = 0; s < l.max_stages(); ++s)
    for (int p = 0; p < l.num_pipelines(); ++p)
      if (s < l.num_stages(p))
        for (int t = 0; t < l.stage_tp(p, s); ++t) out.push_back({p, s, t});
  return out;
}

TEST(LayoutGeneral, RankOfAndPlaceOfRankAreInverseAndFollowTheRankOrder) {
  std::mt19937 rng(12);
  for (int trial = 0; trial < 300; ++trial) {
    const int layers = 1 + static_cast<int>(rng() % 8);
    std::vector<PipelineSpec> pls(1 + rng() % 4);
    for (auto& pl : pls) {
      pl.micro_batch = 1 + static_cast<int>(rng() % 3);
      for (int left = layers; left > 0;) {
        const int n = 1 + static_cast<int>(rng() % static_cast<unsigned>(left));
        pl.stages.push_back({n, 1 + static_cast<int>(rng() % 3), rng() % 2 ? "A" : "B"});
        left -= n;
      }
    }
    const Layout l = general(pls);
    const std::vector<RankPlace> want = naive_ranks(l);
    ASSERT_EQ(l.world_size(), static_cast<int>(want.size())) << l.to_string();
    for (int r = 0; r < l.world_size(); ++r) {
      const RankPlace got = l.place_of_rank(r);
      EXPECT_EQ(got, want[static_cast<size_t>(r)]) << l.to_string() << " rank " << r;
      EXPECT_EQ(l.rank_of(got.stage, got.pipeline, got.tp_rank), r) << l.to_string();
    }
    for (int p = 0; p < l.num_pipelines(); ++p)
      for (int layer = 0; layer < l.num_layers(); ++layer) {
        const int s = l.stage_of(p, layer);
        ASSERT_GE(s, 0);
        EXPECT_GE(layer, l.stage_first_layer(p, s));
        EXPECT_LT(layer, l.stage_first_layer(p, s) + l.stage_layers(p, s));
      }
  }
}

TEST(LayoutGeneral, SymmetricRanksEqualMegatronInBothForms) {
  for (int tp : {1, 2, 3})
    for (int pp : {1, 2, 3})
      for (int dp : {1, 2, 4}) {
        auto sym = Layout::make(tp, pp, dp, 0, 6);
        ASSERT_TRUE(sym.ok());
        // The same structure in the general form (named devices keep it general).
        std::vector<PipelineSpec> pls(static_cast<size_t>(dp));
        for (auto& pl : pls)
          for (int s = 0; s < pp; ++s) pl.stages.push_back({sym->layers_in_stage(s), tp, "X"});
        const Layout gen = general(pls);
        ASSERT_FALSE(gen.symmetric());
        ASSERT_EQ(gen.world_size(), tp * pp * dp);
        for (int s = 0; s < pp; ++s)
          for (int d = 0; d < dp; ++d)
            for (int t = 0; t < tp; ++t) {
              const int megatron = (s * dp + d) * tp + t;
              EXPECT_EQ(sym->rank_of(s, d, t), megatron);
              EXPECT_EQ(gen.rank_of(s, d, t), megatron);
              EXPECT_EQ(sym->place_of_rank(megatron), (RankPlace{d, s, t}));
              EXPECT_EQ(gen.place_of_rank(megatron), (RankPlace{d, s, t}));
            }
      }
}

TEST(LayoutGeneral, StageViewIsTheStagesSymmetricLayout) {
  const Layout l = flashflex();
  const Layout v = l.stage_view(1, 1);  // pipeline 1 stage 1: layers 4..5 at tp 2
  ASSERT_TRUE(v.symmetric());
  EXPECT_EQ(v.tp, 2);
  EXPECT_EQ(v.pp, 2);
  EXPECT_EQ(v.dp, 1);  // pipelines differ: the view has this pipeline only
  EXPECT_EQ(v.stage_of_layer, (std::vector<int>{0, 0, 0, 0, 1, 1}));
  EXPECT_EQ(v.micro_batch, (std::vector<int>{1}));
  EXPECT_TRUE(v.validate().ok());
  // Uniform pipelines (same split and tp, other devices and micro-batches): dp = every pipeline.
  const Layout u = general({pipe(3, {{1, 2, "A"}, {2, 1, "B"}}), pipe(2, {{1, 2, "C"}, {2, 1, "C"}})}, 1);
  ASSERT_TRUE(u.uniform_pipelines());
  const Layout uv = u.stage_view(1, 0);
  EXPECT_EQ(uv.tp, 2);
  EXPECT_EQ(uv.dp, 2);
  EXPECT_EQ(uv.zero, 1);
  EXPECT_EQ(uv.micro_batch, (std::vector<int>{3, 2}));
  EXPECT_EQ(uv.stage_of_layer, (std::vector<int>{0, 1, 1}));
  EXPECT_EQ(u.stage_view(0, 1).tp, 1);
  // A symmetric layout is its own view.
  auto sym = Layout::make(2, 2, 2, 0, 4);
  EXPECT_EQ(sym->stage_view(1, 1).to_json(), sym->to_json());
}

TEST(LayoutGeneral, AsSymmetricDropsDevicesOrNamesWhatNeedsIt) {
  const Layout u = general({pipe(1, {{2, 2, "A"}, {1, 2, "B"}}), pipe(1, {{2, 2, "A"}, {1, 2, "B"}})});
  ASSERT_FALSE(u.symmetric());
  auto s = u.as_symmetric("the Megatron export");
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_TRUE(s->symmetric());
  EXPECT_EQ(s->tp, 2);
  EXPECT_EQ(s->dp, 2);
  EXPECT_EQ(s->stage_of_layer, (std::vector<int>{0, 0, 1}));
  auto f = flashflex().as_symmetric("the Megatron export");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), "Unsupported");
  EXPECT_NE(f.status().message().find("the Megatron export"), std::string::npos);
  // Per-stage tp on uniform pipelines is not symmetric either.
  EXPECT_FALSE(general({pipe(1, {{2, 2, "A"}, {1, 1, "B"}})}).as_symmetric("x").ok());
}

// validate(): one test per error of the general form, each naming the place.
Status validate_pipelines(std::vector<PipelineSpec> pls, int zero = 0, int64_t vocab_divisor = 128) {
  Layout l;
  l.tp = l.pp = l.dp = 0;
  l.zero = zero;
  l.vocab_divisor = vocab_divisor;
  l.pipelines = std::move(pls);
  return l.validate();
}

void expect_bad(const Status& st, const std::string& needle) {
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), "BadLayout");
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
}

TEST(LayoutGeneralValidate, NoPipeline) {  // (an empty list is the symmetric form's Layout)
  auto r = Layout::from_pipelines({}, 0);
  ASSERT_FALSE(r.ok());
  expect_bad(r.status(), "at least one pipeline");
}
TEST(LayoutGeneralValidate, ZeroOutOfRange) { expect_bad(validate_pipelines({pipe(1, {{1, 1, ""}})}, 2), "zero must be 0 or 1"); }
TEST(LayoutGeneralValidate, VocabDivisor) {
  expect_bad(validate_pipelines({pipe(1, {{1, 1, ""}})}, 0, 0), "vocab_divisor");
}
TEST(LayoutGeneralValidate, MicroBatch) { expect_bad(validate_pipelines({pipe(0, {{1, 1, ""}})}), "pipeline 0 has micro_batch 0"); }
TEST(LayoutGeneralValidate, NoStage) { expect_bad(validate_pipelines({pipe(1, {{1, 1, ""}}), pipe(1, {})}), "pipeline 1 has no stage"); }
TEST(LayoutGeneralValidate, EmptyStage) {
  expect_bad(validate_pipelines({pipe(1, {{1, 1, ""}, {0, 1, ""}})}), "pipeline 0 stage 1 holds 0 layers");
}
TEST(LayoutGeneralValidate, StageTp) { expect_bad(validate_pipelines({pipe(1, {{2, 0, ""}})}), "pipeline 0 stage 0 has tp 0"); }
TEST(LayoutGeneralValidate, LayersNotCoveredOncePerPipeline) {
  expect_bad(validate_pipelines({pipe(1, {{2, 1, ""}, {2, 1, ""}}), pipe(1, {{3, 1, ""}})}),
             "pipeline 1 holds 3 layers, pipeline 0 holds 4");
}
TEST(LayoutGeneralValidate, ZeroOneOverPipelinesWhoseStagesDiffer) {
  expect_bad(validate_pipelines({pipe(1, {{2, 1, "A"}, {2, 1, "A"}}), pipe(1, {{2, 2, "B"}, {2, 1, "B"}})}, 1),
             "stage 0 of pipeline 0 holds 2 layers at tp 1, of pipeline 1 2 layers at tp 2");
  expect_bad(validate_pipelines({pipe(1, {{2, 1, ""}, {2, 1, ""}}), pipe(1, {{4, 1, ""}})}, 1),
             "stage 0 of pipeline 0 holds 2 layers at tp 1, of pipeline 1 4 layers at tp 1");
  // Allowed where the peers hold the same parameters (devices and micro-batches may differ).
  EXPECT_TRUE(validate_pipelines({pipe(3, {{2, 2, "A"}, {2, 1, "A"}}), pipe(1, {{2, 2, "B"}, {2, 1, "C"}})}, 1).ok());
}

TEST(LayoutGeneralJson, ErrorsNameTheKey) {
  auto bad = [](const char* text, const std::string& needle) {
    auto r = Layout::from_json(nlohmann::json::parse(text));
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  };
  bad(R"({"pipelines":[{"stages":[{"layers":1,"tp":1,"colour":"red"}]}]})", "unknown key 'colour'");
  bad(R"({"pipelines":[{"stages":[{"tp":1}]}]})", "missing key 'layers'");
  bad(R"({"pipelines":[{"stages":[{"layers":2}]}],"num_layers":3})", "num_layers=3");
  bad(R"({"pipelines":[]})", "non-empty array");
  bad(R"({"pipelines":[{"micro_batch":"2","stages":[{"layers":2}]}]})", "must be an integer");
  bad(R"({"pipelines":[{"stages":[{"layers":2,"device":7}]}]})", "'device' must be a string");
  auto ro = Layout::from_json(nlohmann::json::parse(R"({"pipelines":[{"stages":[{"layers":2}]}],"rank_order":"pp-dp-tp"})"));
  ASSERT_FALSE(ro.ok());
  EXPECT_EQ(ro.status().code(), "Unsupported");
}

}  // namespace layout_test
}  // namespace ckpt
