// LlamaShardingRules against naive references: for every tensor the TP boxes are checked element by
// element (each element covered by the expected rank(s), computed from head/row formulas written
// independently here), GQA replication, vocab padding, stages, optimizer names and refusals.
#include "converters/model/llama_sharding.h"

#include <gtest/gtest.h>

#include <set>

namespace ckpt {
namespace {

LlamaConfig tiny(int64_t V, int64_t h, int64_t I, int64_t L, int64_t H, int64_t K, int64_t hd, bool tied = false,
                 bool bias = false) {
  LlamaConfig c;
  c.vocab_size = V;
  c.hidden_size = h;
  c.intermediate_size = I;
  c.num_hidden_layers = L;
  c.num_attention_heads = H;
  c.num_key_value_heads = K;
  c.head_dim = hd;
  c.tie_word_embeddings = tied;
  c.attention_bias = bias;
  c.mlp_bias = bias;
  return c;
}

Layout layout_of(int tp, std::vector<int> per_stage, int64_t divisor = 128) {
  Layout l;
  l.tp = tp;
  l.pp = static_cast<int>(per_stage.size());
  for (size_t s = 0; s < per_stage.size(); ++s)
    for (int i = 0; i < per_stage[s]; ++i) l.stage_of_layer.push_back(static_cast<int>(s));
  l.vocab_divisor = divisor;
  return l;
}

bool in_box(const Box& b, const Shape& idx) {
  for (size_t d = 0; d < idx.size(); ++d)
    if (idx[d] < b.offset[d] || idx[d] >= b.offset[d] + b.extent[d]) return false;
  return true;
}

// Naive expected owner set of element `idx` of tensor `name` (set of TP ranks holding it).
std::set<int> expected_owners(const LlamaConfig& c, int tp, int64_t divisor, const std::string& name, const Shape& idx) {
  std::set<int> all;
  for (int r = 0; r < tp; ++r) all.insert(r);
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  if (has("embed_tokens") || has("lm_head")) {
    int64_t P = ((c.vocab_size + divisor * tp - 1) / (divisor * tp)) * divisor * tp;
    return {static_cast<int>(idx[0] / (P / tp))};
  }
  if (has("layernorm") || has("model.norm") || has("o_proj.bias") || has("down_proj.bias")) return all;
  if (has("q_proj")) return {static_cast<int>((idx[0] / c.head_dim) / (c.num_attention_heads / tp))};
  if (has("k_proj") || has("v_proj")) {
    int64_t head = idx[0] / c.head_dim;
    std::set<int> s;
    for (int r = 0; r < tp; ++r) {
      // rank r needs the KV head of its first query head's group
      int64_t first_q = r * (c.num_attention_heads / tp);
      int64_t last_q = first_q + c.num_attention_heads / tp - 1;
      int64_t qpg = c.num_attention_heads / c.num_key_value_heads;
      if (head >= first_q / qpg && head <= last_q / qpg) s.insert(r);
    }
    return s;
  }
  if (has("gate_proj") || has("up_proj")) return {static_cast<int>(idx[0] / (c.intermediate_size / tp))};
  if (has("o_proj.weight")) return {static_cast<int>((idx[1] / c.head_dim) / (c.num_attention_heads / tp))};
  if (has("down_proj.weight")) return {static_cast<int>(idx[1] / (c.intermediate_size / tp))};
  ADD_FAILURE() << "no naive rule for " << name;
  return {};
}

void check_coverage(const LlamaConfig& c, const Layout& l) {
  LlamaShardingRules rules(c);
  ASSERT_TRUE(rules.check_layout(l).ok()) << rules.check_layout(l).to_string();
  for (const auto& t : llama_model_tensors(c, DType::kBF16)) {
    auto p = rules.place(t, l);
    ASSERT_TRUE(p.ok()) << t.name << ": " << p.status().to_string();
    ASSERT_EQ(p->tp_boxes.size(), static_cast<size_t>(l.tp)) << t.name;
    EXPECT_FALSE(p->optimizer_state);
    for (const auto& b : p->tp_boxes) ASSERT_TRUE(validate_box(b, t.shape).ok()) << t.name << " " << b.to_string();
    // Enumerate every element (tensors are tiny).
    Box whole = Box::whole(t.shape);
    Shape idx(t.shape.size(), 0);
    int64_t n = whole.numel();
    for (int64_t e = 0; e < n; ++e) {
      int64_t rem = e;
      for (size_t d = t.shape.size(); d-- > 0;) { idx[d] = rem % t.shape[d]; rem /= t.shape[d]; }
      std::set<int> got;
      for (int r = 0; r < l.tp; ++r)
        if (in_box(p->tp_boxes[r], idx)) got.insert(r);
      auto want = expected_owners(c, l.tp, l.vocab_divisor, t.name, idx);
      ASSERT_EQ(got, want) << t.name << " element " << shape_to_string(idx) << " tp=" << l.tp;
    }
    // Optimizer tensors take the placement of their parameter.
    for (const char* k : {"optimizer.exp_avg.", "optimizer.exp_avg_sq.", "optimizer.fp32_param."}) {
      auto q = rules.place(TensorMeta{k + t.name, DType::kF32, t.shape}, l);
      ASSERT_TRUE(q.ok()) << q.status().to_string();
      EXPECT_TRUE(q->optimizer_state);
      EXPECT_EQ(q->tp_boxes, p->tp_boxes);
      EXPECT_EQ(q->stages, p->stages);
    }
  }
}

TEST(LlamaSharding, CoverageMha) { check_coverage(tiny(50, 8, 12, 2, 4, 4, 2), layout_of(2, {1, 1}, 4)); }
TEST(LlamaSharding, CoverageGqaTpDividesK) { check_coverage(tiny(37, 8, 16, 3, 8, 4, 2, false, true), layout_of(4, {3}, 2)); }
TEST(LlamaSharding, CoverageGqaTpGreaterThanK) {
  check_coverage(tiny(37, 8, 16, 2, 8, 2, 2, true, true), layout_of(4, {1, 1}, 1));
  check_coverage(tiny(37, 8, 16, 2, 8, 1, 2), layout_of(8, {2}, 3));
}
TEST(LlamaSharding, CoverageTp1) { check_coverage(tiny(11, 4, 6, 1, 2, 1, 2, true), layout_of(1, {1}, 128)); }

TEST(LlamaSharding, VocabPaddingRanksMayBeEmpty) {
  // V=10, tp=4, divisor 4: P=16, part 4: rows [0,4) [4,8) [8,10) [10,10).
  LlamaConfig c = tiny(10, 4, 8, 1, 4, 4, 1);
  LlamaShardingRules rules(c);
  Layout l = layout_of(4, {1}, 4);
  auto p = rules.place(TensorMeta{"model.embed_tokens.weight", DType::kF32, {10, 4}}, l);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->tp_boxes[0], (Box{{0, 0}, {4, 4}}));
  EXPECT_EQ(p->tp_boxes[2], (Box{{8, 0}, {2, 4}}));
  EXPECT_EQ(p->tp_boxes[3].extent[0], 0);
  EXPECT_TRUE(validate_box(p->tp_boxes[3], {10, 4}).ok());
}

TEST(LlamaSharding, Stages) {
  LlamaConfig c = tiny(16, 4, 8, 5, 2, 2, 2, /*tied=*/true);
  LlamaShardingRules rules(c);
  Layout l = layout_of(1, {1, 3, 1});
  auto st = [&](const std::string& n, Shape s) {
    auto p = rules.place(TensorMeta{n, DType::kF32, s}, l);
    EXPECT_TRUE(p.ok()) << p.status().to_string();
    return p.ok() ? p->stages : std::vector<int>{};
  };
  EXPECT_EQ(st("model.embed_tokens.weight", {16, 4}), (std::vector<int>{0, 2}));  // tied, pp > 1
  EXPECT_EQ(st("model.norm.weight", {4}), (std::vector<int>{2}));
  EXPECT_EQ(st("model.layers.0.input_layernorm.weight", {4}), (std::vector<int>{0}));
  EXPECT_EQ(st("model.layers.3.mlp.up_proj.weight", {8, 4}), (std::vector<int>{1}));
  EXPECT_EQ(st("model.layers.4.self_attn.o_proj.weight", {4, 4}), (std::vector<int>{2}));
  EXPECT_EQ(st("optimizer.exp_avg.model.layers.4.self_attn.o_proj.weight", {4, 4}), (std::vector<int>{2}));
  // Untied: embedding only on stage 0, lm_head on the last.
  LlamaConfig u = c;
  u.tie_word_embeddings = false;
  LlamaShardingRules ru(u);
  EXPECT_EQ(ru.place(TensorMeta{"model.embed_tokens.weight", DType::kF32, {16, 4}}, l)->stages, (std::vector<int>{0}));
  EXPECT_EQ(ru.place(TensorMeta{"lm_head.weight", DType::kF32, {16, 4}}, l)->stages, (std::vector<int>{2}));
  // Tied, pp == 1: one stage.
  EXPECT_EQ(rules.place(TensorMeta{"model.embed_tokens.weight", DType::kF32, {16, 4}}, layout_of(1, {5}))->stages,
            (std::vector<int>{0}));
}

void expect_refused(const LlamaConfig& c, const Layout& l, const std::vector<std::string>& words) {
  Status s = LlamaShardingRules(c).check_layout(l);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.kind(), ErrorKind::kInvalidArgument);
  EXPECT_EQ(s.code(), "LayoutRefused");
  for (const auto& w : words) EXPECT_NE(s.message().find(w), std::string::npos) << s.message() << " lacks " << w;
}

TEST(LlamaSharding, Refusals) {
  LlamaConfig c = tiny(32, 8, 12, 4, 4, 2, 2);
  expect_refused(c, layout_of(1, {1, 1, 1}), {"3 layers", "num_hidden_layers=4"});
  expect_refused(c, layout_of(1, {1, 1, 1, 1, 0}), {"pp=5", "4 layers"});
  expect_refused(c, layout_of(1, {2, 0, 2}), {"stage 1", "no layer"});
  expect_refused(c, layout_of(3, {4}), {"tp=3", "num_attention_heads=4"});
  expect_refused(tiny(32, 8, 12, 4, 6, 3, 2), layout_of(2, {4}), {"tp=2", "num_key_value_heads=3"});
  expect_refused(tiny(32, 8, 12, 4, 8, 4, 2), layout_of(8, {4}), {"intermediate_size=12"});
  // tp=4 > K=2 with K | tp is accepted; tp=6, H=6, K=4 is not (K neither divisible nor divides).
  EXPECT_TRUE(LlamaShardingRules(tiny(32, 8, 12, 4, 8, 2, 2)).check_layout(layout_of(4, {4})).ok());
  Layout bad = layout_of(1, {2, 2});
  bad.stage_of_layer = {1, 0, 1, 1};
  expect_refused(c, bad, {"layer 1", "contiguous"});
}

TEST(LlamaSharding, UnknownAndMisshapenTensors) {
  LlamaConfig c = tiny(32, 8, 12, 2, 4, 2, 2, /*tied=*/true);
  LlamaShardingRules rules(c);
  Layout l = layout_of(2, {2});
  auto r = rules.place(TensorMeta{"model.layers.0.self_attn.rotary_emb.inv_freq", DType::kF32, {1}}, l);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().tensor(), "model.layers.0.self_attn.rotary_emb.inv_freq");
  EXPECT_NE(r.status().message().find("rotary_emb"), std::string::npos);
  r = rules.place(TensorMeta{"lm_head.weight", DType::kF32, {32, 8}}, l);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("ties"), std::string::npos);
  r = rules.place(TensorMeta{"model.layers.5.mlp.up_proj.weight", DType::kF32, {12, 8}}, l);
  ASSERT_FALSE(r.ok());
  r = rules.place(TensorMeta{"optimizer.momentum.model.norm.weight", DType::kF32, {8}}, l);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("optimizer.momentum"), std::string::npos);
  r = rules.place(TensorMeta{"model.layers.0.mlp.up_proj.weight", DType::kF32, {12, 9}}, l);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("[12, 9]"), std::string::npos);
  EXPECT_NE(r.status().message().find("[12, 8]"), std::string::npos);
}

}  // namespace
}  // namespace ckpt
