// zero_buffer (one rank's dense ZeRO-1 buffer, reshard/layout/zero_layout.h) under expert parallelism, in the
// symmetric form and in general layouts with ep/etp per stage (docs/MOE.md "General layouts"): for every stage
// view of every pipeline it equals the dense buffer zero_buffers gives the store (the same segments, total,
// padding and dp), the experts left to the expert buffers (which hold experts only).
#include <gtest/gtest.h>

#include "converters/model/llama_config.h"
#include "converters/model/llama_sharding.h"
#include "reshard/layout/tensor_placement.h"
#include "reshard/layout/zero_layout.h"

namespace ckpt {
namespace zero_buffer_experts_test {  // named: unique in a unity batch

// Transformers' tiny Mixtral shape (fixtures/moe/mixtral): 2 layers, 4 experts of width 48.
LlamaConfig mixtral() {
  auto c = LlamaConfig::from_json(nlohmann::json::parse(R"({
    "model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "vocab_size": 64, "hidden_size": 32,
    "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_local_experts": 4, "num_experts_per_tok": 2, "rms_norm_eps": 1e-5, "tie_word_embeddings": false})"));
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? *c : LlamaConfig{};
}

std::vector<TensorMeta> with_adam(const LlamaConfig& c) {
  std::vector<TensorMeta> out = llama_model_tensors(c, DType::kF32);
  const size_t n = out.size();
  for (const char* kind : {"optimizer.exp_avg.", "optimizer.exp_avg_sq."})
    for (size_t i = 0; i < n; ++i) {
      TensorMeta t = out[i];
      t.name = kind + t.name;
      out.push_back(t);
    }
  return out;
}

void expect_dense_buffers_match(const Layout& layout) {
  const LlamaConfig c = mixtral();
  const LlamaShardingRules rules(c);
  const std::vector<TensorMeta> tensors = with_adam(c);
  ASSERT_TRUE(check_layout_views(layout, rules).ok()) << layout.to_string();
  std::vector<std::vector<StagePlacement>> placed(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto p = place_in_layout(tensors[i], layout, rules);
    ASSERT_TRUE(p.ok()) << p.status().message();
    placed[i] = std::move(p).value();
  }
  auto bufs = zero_buffers(tensors, placed, layout);
  ASSERT_TRUE(bufs.ok()) << bufs.status().message();
  int dense = 0, expert = 0;
  for (const ZeroBuffer& zb : *bufs) {
    if (!zb.members.empty()) {
      ++expert;
      for (const ZeroSegment& seg : zb.segments)
        EXPECT_NE(tensors[seg.tensor].name.find(".mlp.experts."), std::string::npos) << tensors[seg.tensor].name;
      continue;
    }
    ++dense;
    for (int p = 0; p < layout.num_pipelines(); ++p) {
      auto got = zero_buffer(tensors, layout.stage_view(p, zb.stage), rules, zb.stage, zb.tp_rank, zb.kind);
      ASSERT_TRUE(got.ok()) << got.status().message() << " (" << layout.to_string() << ")";
      EXPECT_EQ(got->total, zb.total) << layout.to_string() << " stage " << zb.stage << " tp " << zb.tp_rank << " " << zb.kind;
      EXPECT_EQ(got->padded, zb.padded);
      EXPECT_EQ(got->dp, zb.dp);
      ASSERT_EQ(got->segments.size(), zb.segments.size());
      for (size_t k = 0; k < zb.segments.size(); ++k) {
        EXPECT_EQ(got->segments[k].tensor, zb.segments[k].tensor);
        EXPECT_EQ(got->segments[k].box, zb.segments[k].box);
        EXPECT_EQ(got->segments[k].offset, zb.segments[k].offset);
      }
    }
  }
  EXPECT_GT(dense, 0);
  EXPECT_GT(expert, 0) << layout.to_string();  // the experts are in expert buffers, not in the dense ones
}

TEST(ZeroBufferExperts, SymmetricEpLayout) {
  auto l = Layout::make(2, 2, 2, 1, 2);
  ASSERT_TRUE(l.ok());
  l->ep = 2;
  l->etp = 1;
  ASSERT_TRUE(l->validate().ok());
  expect_dense_buffers_match(*l);
}

TEST(ZeroBufferExperts, GeneralLayoutWithPerStageEp) {
  // Uniform pipelines (ZeRO-1): stage 0 at tp 2 with ep 4 x etp 1 over both pipelines, stage 1 at tp 1 with ep 2.
  const std::vector<StageSpec> stages = {{1, 2, "A", 4, 1}, {1, 1, "B", 2, 0}};
  auto l = Layout::from_pipelines({{2, stages}, {1, stages}}, 1);
  ASSERT_TRUE(l.ok()) << l.status().message();
  ASSERT_FALSE(l->symmetric());
  expect_dense_buffers_match(*l);
}

}  // namespace zero_buffer_experts_test
}  // namespace ckpt
