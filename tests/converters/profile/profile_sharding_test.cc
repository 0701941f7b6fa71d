// ProfileShardingRules against (1) LlamaShardingRules for the reference profile (identical
// placements), (2) hand-enumerated rank boxes of tiny configs, (3) megatron_rank_tensors for the
// megatron-mcore profile, (4) the packings that cannot be split.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "converters/megatron/megatron_segments.h"
#include "converters/model/llama_sharding.h"
#include "converters/profile/profile_sharding.h"
#include "tests/converters/profile/profile_test_util.h"

namespace ckpt {
namespace {

using profile_test::tiny_config;

ProfileShardingRules rules_for(const std::string& profile, const LlamaConfig& c, int tp,
                               const std::vector<TensorMeta>& canonical = {}) {
  auto p = builtin_profile(profile);
  EXPECT_TRUE(p.ok()) << p.status().message();
  auto ts = profile_tensors(*p, c, canonical, tp);
  EXPECT_TRUE(ts.ok()) << ts.status().message();
  return ProfileShardingRules(c, ts.ok() ? *ts : std::vector<ProfileTensor>{});
}

TensorPlacement place_ok(const ProfileShardingRules& rules, const std::string& name, const Layout& layout) {
  const ProfileTensor* t = rules.find(name);
  EXPECT_NE(t, nullptr) << name;
  if (!t) return {};
  auto p = rules.place(TensorMeta{t->name, t->dtype, t->shape}, layout);
  EXPECT_TRUE(p.ok()) << name << ": " << p.status().message();
  return p.ok() ? *p : TensorPlacement{};
}

Layout layout_of(int tp, int pp, int layers) {
  auto l = Layout::make(tp, pp, 1, 0, layers);
  EXPECT_TRUE(l.ok());
  return *l;
}

TEST(ProfileSharding, ReferenceEqualsLlamaSharding) {
  for (int64_t kv : {4, 2, 1}) {  // tp=4 with kv 2 and 1: KV heads replicated
    LlamaConfig c = tiny_config(4, kv, 2, 37, 3, 8);
    c.attention_bias = true;
    c.mlp_bias = true;
    std::vector<TensorMeta> canonical = llama_model_tensors(c, DType::kBF16);
    const size_t n = canonical.size();
    for (size_t i = 0; i < n; ++i)
      for (const char* k : {"exp_avg", "exp_avg_sq", "fp32_param"})
        canonical.push_back({std::string("optimizer.") + k + "." + canonical[i].name, DType::kF32, canonical[i].shape});
    const LlamaShardingRules llama(c);
    for (int tp : {1, 2, 4}) {
      const ProfileShardingRules rules = rules_for("reference", c, tp, canonical);
      ASSERT_EQ(rules.tensors().size(), canonical.size());
      for (int pp : {1, 2}) {
        Layout layout = layout_of(tp, pp, 3);
        layout.vocab_divisor = 8;
        for (const auto& t : canonical) {
          auto want = llama.place(t, layout);
          ASSERT_TRUE(want.ok()) << want.status().message();
          const TensorPlacement got = place_ok(rules, t.name, layout);
          EXPECT_EQ(got.stages, want->stages) << t.name;
          EXPECT_EQ(got.tp_boxes, want->tp_boxes) << t.name << " tp=" << tp << " kv=" << kv;
          EXPECT_EQ(got.optimizer_state, want->optimizer_state) << t.name;
        }
      }
    }
  }
}

// H=4 heads, K=2 groups, head_dim 1, hidden 4, intermediate 4, vocab 5, tp 2: rank boxes by hand.
TEST(ProfileSharding, HandEnumeratedMegatronAndPaddle) {
  const LlamaConfig c = tiny_config(4, 2, 1, 5, 2, 4);
  const Layout layout = layout_of(2, 2, 2);
  const ProfileShardingRules mc = rules_for("megatron-mcore", c, 2);
  // linear_qkv rows [q0 q1 k0 v0 | q2 q3 k1 v1]: one group per rank.
  auto p = place_ok(mc, "decoder.layers.1.self_attention.linear_qkv.weight", layout);
  EXPECT_EQ(p.stages, std::vector<int>{1});
  EXPECT_EQ(p.tp_boxes, (std::vector<Box>{Box{{0, 0}, {4, 4}}, Box{{4, 0}, {4, 4}}}));
  // linear_fc1 rows [g0 g1 u0 u1 | g2 g3 u2 u3].
  p = place_ok(mc, "decoder.layers.0.mlp.linear_fc1.weight", layout);
  EXPECT_EQ(p.tp_boxes, (std::vector<Box>{Box{{0, 0}, {4, 4}}, Box{{4, 0}, {4, 4}}}));
  // linear_proj: row-parallel, columns.
  p = place_ok(mc, "decoder.layers.0.self_attention.linear_proj.weight", layout);
  EXPECT_EQ(p.tp_boxes, (std::vector<Box>{Box{{0, 0}, {4, 2}}, Box{{0, 2}, {4, 2}}}));
  // Embedding: 256 padded rows, 128 per rank (zero rows included); stage 0 only (untied).
  p = place_ok(mc, "embedding.word_embeddings.weight", layout);
  EXPECT_EQ(p.stages, std::vector<int>{0});
  EXPECT_EQ(p.tp_boxes, (std::vector<Box>{Box{{0, 0}, {128, 4}}, Box{{128, 0}, {128, 4}}}));
  p = place_ok(mc, "decoder.final_layernorm.weight", layout);
  EXPECT_EQ(p.tp_boxes, (std::vector<Box>{Box{{0}, {4}}, Box{{0}, {4}}}));
  EXPECT_EQ(p.stages, std::vector<int>{1});

  const ProfileShardingRules pd = rules_for("paddlenlp-fused", c, 2);
  // qkv_proj stored [in=4, out=8]: each rank a block of columns.
  p = place_ok(pd, "llama.layers.0.self_attn.qkv_proj.weight", layout);
  EXPECT_EQ(p.tp_boxes, (std::vector<Box>{Box{{0, 0}, {4, 4}}, Box{{0, 4}, {4, 4}}}));
  // down_proj stored [in=I, out=h]: row-parallel columns of HF's [h, I] become rows.
  p = place_ok(pd, "llama.layers.0.mlp.down_proj.weight", layout);
  EXPECT_EQ(p.tp_boxes, (std::vector<Box>{Box{{0, 0}, {2, 4}}, Box{{2, 0}, {2, 4}}}));
  // lm_head stored [h, V]: vocab-parallel columns; no padding, so the layout's split clipped to 5.
  p = place_ok(pd, "lm_head.weight", layout);
  EXPECT_EQ(p.tp_boxes, (std::vector<Box>{Box{{0, 0}, {4, 5}}, Box{{0, 5}, {4, 0}}}));
  EXPECT_EQ(p.stages, std::vector<int>{1});
}

// Every shipped profile, tp 1, 2, 4: what TP rank r holds of the profile's tensors, cut back into
// canonical boxes (profile_segments_in), is exactly LlamaShardingRules' box of r for every
// canonical tensor: each piece inside it, no two overlapping, together all of it.
TEST(ProfileSharding, EveryProfileRankHoldsTheCanonicalRankBoxes) {
  for (const auto& name : builtin_profile_names()) {
    LlamaConfig c = tiny_config(8, name == "libai" ? 8 : 4, 2, 37, 2, 8);
    c.attention_bias = true;
    c.mlp_bias = true;
    const LlamaShardingRules llama(c);
    for (int tp : {1, 2, 4}) {
      const ProfileShardingRules rules = rules_for(name, c, tp);
      const Layout layout = layout_of(tp, 1, 2);
      for (int r = 0; r < tp; ++r) {
        std::map<std::string, std::vector<Box>> pieces;
        for (const auto& t : rules.tensors()) {
          Box box = place_ok(rules, t.name, layout).tp_boxes.at(r);
          if (t.transposed) {
            std::reverse(box.offset.begin(), box.offset.end());
            std::reverse(box.extent.begin(), box.extent.end());
          }
          for (const auto& s : profile_segments_in(t, box))
            if (!s.canonical.empty()) pieces[s.canonical].push_back(s.box);
        }
        for (const auto& t : llama_model_tensors(c, DType::kF32)) {
          auto want = llama.place(t, layout);
          ASSERT_TRUE(want.ok()) << want.status().message();
          const Box& w = want->tp_boxes[r];
          const auto& got = pieces[t.name];
          int64_t sum = 0;
          for (size_t i = 0; i < got.size(); ++i) {
            EXPECT_TRUE(w.contains(got[i])) << name << " tp=" << tp << " rank " << r << " " << t.name << " "
                                            << got[i].to_string() << " outside " << w.to_string();
            for (size_t j = 0; j < i; ++j) EXPECT_FALSE(intersect(got[i], got[j]).has_value()) << name << " " << t.name;
            sum += got[i].numel();
          }
          EXPECT_EQ(sum, w.numel()) << name << " tp=" << tp << " rank " << r << " " << t.name;
        }
      }
    }
  }
}

// Tied embeddings: no output head tensor; the embedding lives on the first and the last stage.
TEST(ProfileSharding, TiedEmbeddings) {
  LlamaConfig c = tiny_config(4, 2, 1, 5, 2, 4);
  c.tie_word_embeddings = true;
  const ProfileShardingRules rules = rules_for("megatron-mcore", c, 2);
  EXPECT_EQ(rules.find("output_layer.weight"), nullptr);
  const TensorPlacement p = place_ok(rules, "embedding.word_embeddings.weight", layout_of(2, 2, 2));
  EXPECT_EQ(p.stages, (std::vector<int>{0, 1}));
  EXPECT_EQ(p.tp_boxes, (std::vector<Box>{Box{{0, 0}, {128, 4}}, Box{{128, 0}, {128, 4}}}));
  auto bad = rules.place(TensorMeta{"embedding.word_embeddings.weight", DType::kBF16, {5, 4}}, layout_of(2, 2, 2));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), "ShapeMismatch");
  bad = rules.place(TensorMeta{"decoder.layers.9.mlp.linear_fc2.weight", DType::kBF16, {4, 4}}, layout_of(2, 2, 2));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), "UnknownTensor");
}

TEST(ProfileSharding, ProfileNotSplittable) {
  const LlamaConfig c = tiny_config(4, 2, 1, 5, 2, 4);
  auto expect_refused = [&](const ProfileShardingRules& rules, const std::string& name, int tp) {
    const ProfileTensor* t = rules.find(name);
    ASSERT_NE(t, nullptr) << name;
    auto p = rules.place(TensorMeta{t->name, t->dtype, t->shape}, layout_of(tp, 1, 2));
    ASSERT_FALSE(p.ok()) << name;
    EXPECT_EQ(p.status().code(), "ProfileNotSplittable");
    EXPECT_NE(p.status().message().find(name), std::string::npos) << p.status().message();
    EXPECT_NE(p.status().message().find("tp=" + std::to_string(tp)), std::string::npos) << p.status().message();
  };
  // Megatron groups with tp=4 > 2 KV heads: a rank holds half a group's q and the whole k, v.
  expect_refused(rules_for("megatron-mcore", c, 4), "decoder.layers.0.self_attention.linear_qkv.weight", 4);
  // fused [gate_r; up_r] built for tp=2, placed at tp=4.
  expect_refused(rules_for("megatron-mcore", c, 2), "decoder.layers.0.mlp.linear_fc1.weight", 4);
  // q|k|v fused whole at tp=2.
  auto p = builtin_profile("hf");
  ASSERT_TRUE(p.ok());
  p->qkv = QkvPacking::kFusedWhole;
  p->names = {{"embed", "e"},          {"final_norm", "n"}, {"lm_head", "h"}, {"input_norm", "{i}.in"},
              {"post_norm", "{i}.post"}, {"qkv", "{i}.qkv"}, {"o", "{i}.o"},  {"gate", "{i}.g"},
              {"up", "{i}.u"},           {"down", "{i}.d"}};
  auto ts = profile_tensors(*p, c, {}, 2);
  ASSERT_TRUE(ts.ok());
  expect_refused(ProfileShardingRules(c, *ts), "0.qkv", 2);
}

// The megatron-mcore profile's rank boxes, cut into segments, equal megatron_rank_tensors.
TEST(ProfileSharding, MegatronMcoreRanksEqualMegatronSegments) {
  for (int tp : {1, 2, 4}) {
    const LlamaConfig c = tiny_config(8, 4, 2, 300, 3, 8);
    const Layout layout = layout_of(tp, 2, 3);
    const ProfileShardingRules rules = rules_for("megatron-mcore", c, tp);
    size_t compared = 0;
    for (int pp = 0; pp < 2; ++pp)
      for (int r = 0; r < tp; ++r) {
        auto mt = megatron_rank_tensors(c, layout, r, pp);
        ASSERT_TRUE(mt.ok()) << mt.status().message();
        for (const auto& m : *mt) {
          std::string global = m.name;
          if (global.starts_with("decoder.layers.")) {
            const size_t dot = global.find('.', 15);
            global = "decoder.layers." + std::to_string(layout.first_layer(pp) + std::stoi(global.substr(15, dot - 15))) +
                     global.substr(dot);
          }
          const TensorPlacement p = place_ok(rules, global, layout);
          ASSERT_EQ(p.tp_boxes.size(), static_cast<size_t>(tp));
          EXPECT_NE(std::find(p.stages.begin(), p.stages.end(), pp), p.stages.end()) << global;
          const auto segs = profile_segments_in(*rules.find(global), p.tp_boxes[r]);
          ASSERT_EQ(segs.size(), m.segments.size()) << global << " tp=" << tp << " rank " << r;
          for (size_t i = 0; i < segs.size(); ++i) {
            EXPECT_EQ(segs[i].canonical, m.segments[i].tensor) << global;
            EXPECT_EQ(segs[i].zero_rows, m.segments[i].zero_rows) << global;
            if (!segs[i].canonical.empty()) {
              EXPECT_EQ(segs[i].box, m.segments[i].box) << global;
            }
          }
          ++compared;
        }
      }
    EXPECT_GT(compared, 0u);
  }
}

}  // namespace
}  // namespace ckpt
