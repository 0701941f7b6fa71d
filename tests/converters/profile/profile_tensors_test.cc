// profile_tensors against hand-enumerated row lists (tiny configs: every row of every packed
// tensor written out by hand from the frameworks' conversion code, docs/PROFILES.md), and the
// megatron-mcore profile sliced per TP rank against converters/megatron/megatron_segments.
#include <gtest/gtest.h>

#include "converters/megatron/megatron_segments.h"
#include "converters/profile/profile.h"
#include "tests/converters/profile/profile_test_util.h"

namespace ckpt {
namespace {

using profile_test::find_tensor;
using profile_test::row_list;
using profile_test::tiny_config;
using Rows = std::vector<std::string>;

Profile builtin(const std::string& name) {
  auto p = builtin_profile(name);
  EXPECT_TRUE(p.ok()) << p.status().message();
  return p.ok() ? *p : Profile{};
}

std::vector<ProfileTensor> tensors(const Profile& p, const LlamaConfig& c, int tp,
                                   const std::vector<TensorMeta>& canonical = {}) {
  auto r = profile_tensors(p, c, canonical, tp);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? *r : std::vector<ProfileTensor>{};
}

TEST(ProfileTensors, MegatronMcorePacking) {
  // H=4 heads in K=2 groups, head_dim 1, hidden 4, intermediate 4, vocab 5, tp 2.
  const auto ts = tensors(builtin("megatron-mcore"), tiny_config(4, 2, 1, 5), 2);
  const ProfileTensor* qkv = find_tensor(ts, "decoder.layers.1.self_attention.linear_qkv.weight");
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(row_list(*qkv), (Rows{"q0", "q1", "k0", "v0", "q2", "q3", "k1", "v1"}));
  EXPECT_EQ(qkv->shape, (Shape{8, 4}));
  EXPECT_EQ(qkv->dtype, DType::kBF16);
  EXPECT_FALSE(qkv->transposed);
  const ProfileTensor* fc1 = find_tensor(ts, "decoder.layers.0.mlp.linear_fc1.weight");
  ASSERT_NE(fc1, nullptr);
  EXPECT_EQ(row_list(*fc1), (Rows{"gate0", "gate1", "up0", "up1", "gate2", "gate3", "up2", "up3"}));
  const ProfileTensor* emb = find_tensor(ts, "embedding.word_embeddings.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->shape, (Shape{256, 4}));  // 5 padded to 128 x tp
  Rows want{"embed0", "embed1", "embed2", "embed3", "embed4"};
  want.resize(256, "0");
  EXPECT_EQ(row_list(*emb), want);
  EXPECT_EQ(emb->cls, TensorClass::kEmbedding);
  const ProfileTensor* head = find_tensor(ts, "output_layer.weight");
  ASSERT_NE(head, nullptr);
  EXPECT_EQ(head->shape, (Shape{256, 4}));
  const ProfileTensor* norm = find_tensor(ts, "decoder.layers.0.mlp.linear_fc1.layer_norm_weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(row_list(*norm), (Rows{"post_norm0", "post_norm1", "post_norm2", "post_norm3"}));
  EXPECT_EQ(norm->cls, TensorClass::kNorm);
  // Canonical order, one tensor per packed group.
  Rows names;
  for (const auto& t : ts) names.push_back(t.name);
  EXPECT_EQ(names.size(), 1u + 2u * 6u + 2u);
  EXPECT_EQ(names[0], "embedding.word_embeddings.weight");
  EXPECT_EQ(names[1], "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight");
  EXPECT_EQ(names[2], "decoder.layers.0.self_attention.linear_qkv.weight");
  EXPECT_EQ(names[3], "decoder.layers.0.self_attention.linear_proj.weight");
  EXPECT_EQ(names.back(), "output_layer.weight");
}

TEST(ProfileTensors, LibaiHeads) {
  // LiBai _fix_qkv_ordering: view [3, H, hd, hidden] -> permute(1, 0, 2, 3): per head [q_h; k_h; v_h].
  const auto ts = tensors(builtin("libai"), tiny_config(2, 2, 2, 5), 1);
  const ProfileTensor* qkv = find_tensor(ts, "model.layers.0.self_attn.query_key_value.weight");
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(row_list(*qkv), (Rows{"q0", "q1", "k0", "k1", "v0", "v1", "q2", "q3", "k2", "k3", "v2", "v3"}));
  EXPECT_EQ(qkv->dtype, DType::kF32);
  EXPECT_EQ(find_tensor(ts, "model.embed_tokens.weight")->shape, (Shape{5, 4}));  // no padding
  EXPECT_NE(find_tensor(ts, "model.layers.1.mlp.gate_proj.weight"), nullptr);
}

TEST(ProfileTensors, PaddleFusedTransposed) {
  // fuse_param_func: per KV group [q heads | k | v]; naive_fuse_split_tp: rank r holds [gate_r | up_r].
  const auto ts = tensors(builtin("paddlenlp-fused"), tiny_config(4, 2, 1, 5), 2);
  const ProfileTensor* qkv = find_tensor(ts, "llama.layers.0.self_attn.qkv_proj.weight");
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(row_list(*qkv), (Rows{"q0", "q1", "k0", "v0", "q2", "q3", "k1", "v1"}));
  EXPECT_TRUE(qkv->transposed);
  EXPECT_EQ(qkv->shape, (Shape{4, 8}));  // [in, out]
  EXPECT_EQ(qkv->untransposed_shape(), (Shape{8, 4}));
  const ProfileTensor* gu = find_tensor(ts, "llama.layers.1.mlp.gate_up_fused_proj.weight");
  ASSERT_NE(gu, nullptr);
  EXPECT_EQ(row_list(*gu), (Rows{"gate0", "gate1", "up0", "up1", "gate2", "gate3", "up2", "up3"}));
  EXPECT_EQ(gu->shape, (Shape{4, 8}));
  const ProfileTensor* down = find_tensor(ts, "llama.layers.1.mlp.down_proj.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_TRUE(down->transposed);
  EXPECT_EQ(down->shape, (Shape{4, 4}));
  const ProfileTensor* head = find_tensor(ts, "lm_head.weight");
  ASSERT_NE(head, nullptr);
  EXPECT_TRUE(head->transposed);  // PaddleNLP maps lm_head.weight with "transpose"
  EXPECT_EQ(head->shape, (Shape{4, 5}));
  const ProfileTensor* emb = find_tensor(ts, "llama.embed_tokens.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_FALSE(emb->transposed);
  EXPECT_FALSE(find_tensor(ts, "llama.norm.weight")->transposed);
}

TEST(ProfileTensors, FusedWholeAndPerTp) {
  Profile p = builtin("hf");
  p.qkv = QkvPacking::kFusedPerTp;
  p.mlp = MlpPacking::kFusedWhole;
  p.names = {{"embed", "e"},      {"final_norm", "n"}, {"lm_head", "h"},      {"input_norm", "{i}.in"},
             {"post_norm", "{i}.post"}, {"qkv", "{i}.qkv"}, {"o", "{i}.o"}, {"gate_up", "{i}.gu"}, {"down", "{i}.d"}};
  auto ts = tensors(p, tiny_config(4, 4, 1, 5), 2);
  EXPECT_EQ(row_list(*find_tensor(ts, "0.qkv")),
            (Rows{"q0", "q1", "k0", "k1", "v0", "v1", "q2", "q3", "k2", "k3", "v2", "v3"}));
  EXPECT_EQ(row_list(*find_tensor(ts, "1.gu")), (Rows{"gate0", "gate1", "gate2", "gate3", "up0", "up1", "up2", "up3"}));
  p.qkv = QkvPacking::kFusedWhole;
  ts = tensors(p, tiny_config(4, 4, 1, 5), 2);
  EXPECT_EQ(row_list(*find_tensor(ts, "0.qkv")),
            (Rows{"q0", "q1", "q2", "q3", "k0", "k1", "k2", "k3", "v0", "v1", "v2", "v3"}));
}

TEST(ProfileTensors, OptimizerTensorsFollowTheirParameter) {
  const LlamaConfig c = tiny_config(4, 2, 1, 5, 1);
  std::vector<TensorMeta> canonical = llama_model_tensors(c, DType::kBF16);
  const size_t n_model = canonical.size();
  for (size_t i = 0; i < n_model; ++i)
    canonical.push_back({"optimizer.exp_avg." + canonical[i].name, DType::kF32, canonical[i].shape});
  const auto ts = tensors(builtin("megatron-mcore"), c, 2, canonical);
  const ProfileTensor* m = find_tensor(ts, "optimizer.exp_avg.decoder.layers.0.self_attention.linear_qkv.weight");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->cls, TensorClass::kOptimizer);
  EXPECT_EQ(m->dtype, DType::kF32);
  EXPECT_EQ(m->shape, (Shape{8, 4}));
  ASSERT_EQ(m->segments.size(), 6u);
  EXPECT_EQ(m->segments[1].canonical, "optimizer.exp_avg.model.layers.0.self_attn.k_proj.weight");
  const ProfileTensor* e = find_tensor(ts, "optimizer.exp_avg.embedding.word_embeddings.weight");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->segments.back().zero_rows, 256 - 5);
  // Model tensors first (their dtypes from the source), then one optimizer tensor per parameter.
  EXPECT_EQ(ts.size(), 2u * (1u + 6u + 2u));
  EXPECT_EQ(ts[0].dtype, DType::kBF16);
  // A packed optimizer tensor whose partners are missing is refused.
  canonical.resize(n_model + 3);  // exp_avg of embed, input norm, q only
  auto r = profile_tensors(builtin("megatron-mcore"), c, canonical, 2);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), "ProfileUnsupported");
  EXPECT_NE(r.status().message().find("k_proj"), std::string::npos) << r.status().message();
}

TEST(ProfileTensors, SegmentsInABox) {
  const auto ts = tensors(builtin("megatron-mcore"), tiny_config(4, 2, 1, 5), 2);
  const ProfileTensor* qkv = find_tensor(ts, "decoder.layers.0.self_attention.linear_qkv.weight");
  ASSERT_NE(qkv, nullptr);
  // Rows 1..5, columns 2..4: [q1; k0; v0; q2] narrowed to columns 2..4.
  const auto segs = profile_segments_in(*qkv, Box{{1, 2}, {4, 2}});
  ASSERT_EQ(segs.size(), 4u);
  EXPECT_EQ(segs[0].box, (Box{{1, 2}, {1, 2}}));
  EXPECT_EQ(profile_test::short_name(segs[3].canonical), "q");
  EXPECT_EQ(segs[3].box, (Box{{2, 2}, {1, 2}}));
  const ProfileTensor* emb = find_tensor(ts, "embedding.word_embeddings.weight");
  const auto pad = profile_segments_in(*emb, Box{{3, 0}, {125, 4}});
  ASSERT_EQ(pad.size(), 2u);
  EXPECT_EQ(pad[0].box, (Box{{3, 0}, {2, 4}}));
  EXPECT_EQ(pad[1].zero_rows, 123);
}

// The megatron-mcore profile at tp, each TP rank's rows (column-parallel, vocab) or columns
// (row-parallel) taken naively as the rank's even share, equals megatron_rank_tensors.
TEST(ProfileTensors, MegatronMcoreEqualsMegatronSegments) {
  const Profile p = builtin("megatron-mcore");
  for (int tp : {1, 2, 4}) {
    const LlamaConfig c = tiny_config(8, 4, 2, 300, 3, 8);
    auto layout = Layout::make(tp, 2, 1, 0, 3);
    ASSERT_TRUE(layout.ok());
    const auto ts = tensors(p, c, tp);
    for (int pp = 0; pp < 2; ++pp)
      for (int r = 0; r < tp; ++r) {
        auto mt = megatron_rank_tensors(c, *layout, r, pp);
        ASSERT_TRUE(mt.ok()) << mt.status().message();
        for (const auto& m : *mt) {
          std::string global = m.name;  // local layer index -> global
          if (global.starts_with("decoder.layers.")) {
            const size_t dot = global.find('.', 15);
            const int local = std::stoi(global.substr(15, dot - 15));
            global = "decoder.layers." + std::to_string(layout->first_layer(pp) + local) + global.substr(dot);
          }
          const ProfileTensor* t = find_tensor(ts, global);
          ASSERT_NE(t, nullptr) << global;
          const Shape s = t->untransposed_shape();
          const bool row_parallel = global.ends_with("linear_proj.weight") || global.ends_with("linear_fc2.weight");
          const bool replicated = s.size() == 1;
          Box box = Box::whole(s);
          if (row_parallel) box = Box{{0, r * s[1] / tp}, {s[0], s[1] / tp}};
          else if (!replicated) box = Box{{r * s[0] / tp, 0}, {s[0] / tp, s[1]}};
          const auto segs = profile_segments_in(*t, box);
          ASSERT_EQ(segs.size(), m.segments.size()) << global << " tp=" << tp << " rank " << r;
          for (size_t i = 0; i < segs.size(); ++i) {
            EXPECT_EQ(segs[i].canonical, m.segments[i].tensor) << global;
            EXPECT_EQ(segs[i].zero_rows, m.segments[i].zero_rows) << global;
            if (!segs[i].canonical.empty()) {
              EXPECT_EQ(segs[i].box, m.segments[i].box) << global << " segment " << i;
            }
          }
        }
      }
  }
}

}  // namespace
}  // namespace ckpt
