// profile_from_json / builtin_profile / load_profile: one test per named rule, every message
// naming the origin, the field, what was expected and what was found.
#include <gtest/gtest.h>

#include <fstream>

#include "converters/profile/profile.h"
#include "tests/converters/profile/profile_test_util.h"
#include "tests/temp_dir.h"

namespace ckpt {
namespace {

using nlohmann::json;

// A valid profile (the hf one's shape) to break one field at a time.
json good() {
  return json::parse(R"({
    "name": "mine", "description": "test",
    "dtypes": {"weight": "bf16", "norm": "F32", "embedding": "keep", "optimizer": "F32"},
    "vocab_padding": {"multiple": 64, "scales_with_tp": true},
    "qkv_packing": "separate", "mlp_packing": "separate", "orientation": "in-out",
    "names": {"embed": "e", "final_norm": "n", "lm_head": "h", "input_norm": "l.{i}.in",
              "post_norm": "l.{i}.post", "q": "l.{i}.q", "k": "l.{i}.k", "v": "l.{i}.v", "o": "l.{i}.o",
              "gate": "l.{i}.g", "up": "l.{i}.u", "down": "l.{i}.d"},
    "config_keys": {"num_hidden_layers": "layers"},
    "sources": ["somewhere"]})");
}

// Expects code `code` and a message holding the origin and every fragment.
void expect_error(const json& j, const std::string& code, std::vector<std::string> fragments) {
  auto r = profile_from_json(j, "file 'x.json'");
  ASSERT_FALSE(r.ok()) << j.dump();
  EXPECT_EQ(r.status().code(), code) << r.status().message();
  fragments.push_back("file 'x.json'");
  for (const auto& f : fragments) EXPECT_NE(r.status().message().find(f), std::string::npos) << r.status().message();
}

TEST(ProfileParse, GoodProfileAndRoundTrip) {
  auto r = profile_from_json(good(), "test");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->name, "mine");
  EXPECT_EQ(r->dtype_weight, DType::kBF16);
  EXPECT_EQ(r->dtype_norm, DType::kF32);
  EXPECT_FALSE(r->dtype_embedding.has_value());
  EXPECT_EQ(r->vocab.padded(100, 2), 128);
  EXPECT_EQ(r->vocab.padded(129, 2), 256);
  EXPECT_EQ(r->orientation, Orientation::kInOut);
  EXPECT_EQ(r->pattern("q"), "l.{i}.q");
  EXPECT_EQ(r->stored_dtype(TensorClass::kEmbedding, DType::kF16), DType::kF16);  // keep
  EXPECT_EQ(r->stored_dtype(TensorClass::kWeight, DType::kF32), DType::kBF16);
  EXPECT_EQ(r->stored_dtype(TensorClass::kWeight, DType::kI64), DType::kI64);  // not a float: kept
  auto again = profile_from_json(r->to_json(), "round trip");
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(again->to_json(), r->to_json());
}

TEST(ProfileParse, ProfileUnknownField) {
  json j = good();
  j["fuse_qkv"] = true;
  expect_error(j, "ProfileUnknownField", {"'fuse_qkv'", "expected one of the keys", "unknown key"});
  j = good();
  j["dtypes"]["bias"] = "F32";
  expect_error(j, "ProfileUnknownField", {"'dtypes.bias'"});
  j = good();
  j["names"]["rotary"] = "l.{i}.rot";
  expect_error(j, "ProfileUnknownField", {"'names.rotary'", "a tensor kind"});
  j = good();
  j["config_keys"]["num_layers_x"] = "n";
  expect_error(j, "ProfileUnknownField", {"'config_keys.num_layers_x'"});
}

TEST(ProfileParse, ProfileBadValue) {
  json j = good();
  j["qkv_packing"] = "per-head";
  expect_error(j, "ProfileBadValue", {"'qkv_packing'", "megatron-groups", "\"per-head\""});
  j = good();
  j["vocab_padding"]["multiple"] = 0;
  expect_error(j, "ProfileBadValue", {"'vocab_padding.multiple'", "[1,", "0"});
  j = good();
  j["dtypes"]["weight"] = "I32";
  expect_error(j, "ProfileBadValue", {"'dtypes.weight'", "float dtype", "\"I32\""});
  j = good();
  j["names"]["q"] = "l.q";
  expect_error(j, "ProfileBadValue", {"'names.q'", "{i} exactly once", "\"l.q\""});
  j = good();
  j["names"]["embed"] = "e.{i}";
  expect_error(j, "ProfileBadValue", {"'names.embed'", "without {i}"});
  j = good();
  j["names"]["k"] = "l.{j}.k";
  expect_error(j, "ProfileBadValue", {"'names.k'"});
  j = good();
  j.erase("orientation");
  expect_error(j, "ProfileBadValue", {"'orientation'", "required"});
  j = good();
  j["name"] = "Has Space";
  expect_error(j, "ProfileBadValue", {"'name'"});
  expect_error(json::array(), "ProfileBadValue", {"a JSON object"});
}

TEST(ProfileParse, ProfileContradiction) {
  json j = good();
  j["names"]["qkv"] = "l.{i}.qkv";  // separate q/k/v packing with a packed name
  expect_error(j, "ProfileContradiction", {"'names.qkv'", "qkv_packing \"separate\"", "\"l.{i}.qkv\""});
  j = good();
  j["mlp_packing"] = "fused-per-tp";
  j["names"]["gate_up"] = "l.{i}.gu";  // gate and up still named
  expect_error(j, "ProfileContradiction", {"'names.gate'", "mlp_packing \"fused-per-tp\""});
  j = good();
  j["names"]["qkv_bias"] = "l.{i}.qkv_b";
  expect_error(j, "ProfileContradiction", {"'names.qkv_bias'"});
}

TEST(ProfileParse, ProfileIncompleteNaming) {
  json j = good();
  j["names"].erase("down");
  expect_error(j, "ProfileIncompleteNaming", {"'names.down'", "found none"});
  j = good();
  j["qkv_packing"] = "megatron-groups";
  for (const char* k : {"q", "k", "v"}) j["names"].erase(k);
  expect_error(j, "ProfileIncompleteNaming", {"'names.qkv'", "megatron-groups"});
  // A model with biases needs the bias kinds (checked against the model by profile_tensors).
  auto p = profile_from_json(good(), "test");
  ASSERT_TRUE(p.ok());
  LlamaConfig c = profile_test::tiny_config(2, 2, 2, 8);
  c.attention_bias = true;
  auto t = profile_tensors(*p, c, {}, 1);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), "ProfileIncompleteNaming");
  EXPECT_NE(t.status().message().find("'names.q_bias'"), std::string::npos) << t.status().message();
  EXPECT_NE(t.status().message().find("attention_bias"), std::string::npos) << t.status().message();
}

TEST(ProfileParse, ProfileDuplicateName) {
  json j = good();
  j["names"]["k"] = "l.{i}.q";
  expect_error(j, "ProfileDuplicateName", {"'names.k'", "\"l.{i}.q\"", "names.q"});
  j = good();
  j["config_keys"]["hidden_size"] = "layers";
  expect_error(j, "ProfileDuplicateName", {"config_keys.", "\"layers\""});
}

TEST(ProfileParse, ProfileUnknown) {
  auto r = builtin_profile("nvidia-fancy");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), "ProfileUnknown");
  for (const auto& n : builtin_profile_names())
    EXPECT_NE(r.status().message().find(n), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("'nvidia-fancy'"), std::string::npos);
}

TEST(ProfileParse, ProfileUnsupported) {
  auto libai = builtin_profile("libai");
  ASSERT_TRUE(libai.ok()) << libai.status().message();
  auto r = profile_tensors(*libai, profile_test::tiny_config(4, 2, 2, 8), {}, 1);  // GQA
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), "ProfileUnsupported");
  EXPECT_NE(r.status().message().find("libai-heads"), std::string::npos) << r.status().message();
  auto mc = builtin_profile("megatron-mcore");
  ASSERT_TRUE(mc.ok());
  r = profile_tensors(*mc, profile_test::tiny_config(4, 2, 2, 8, 2, 6), {}, 4);  // I=6, tp=4
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), "ProfileUnsupported");
  EXPECT_NE(r.status().message().find("intermediate_size=6"), std::string::npos) << r.status().message();
}

TEST(ProfileParse, BuiltinsParseAndCiteSources) {
  const std::vector<std::string> expected = {"hf", "libai", "megatron-legacy", "megatron-mcore", "paddlenlp",
                                             "paddlenlp-fused", "reference"};
  EXPECT_EQ(builtin_profile_names(), expected);
  for (const auto& n : expected) {
    auto p = builtin_profile(n);
    ASSERT_TRUE(p.ok()) << n << ": " << p.status().message();
    EXPECT_EQ(p->name, n);
    EXPECT_FALSE(p->sources.empty()) << n;
    EXPECT_FALSE(p->description.empty()) << n;
  }
  auto ref = builtin_profile("reference");
  ASSERT_TRUE(ref.ok());
  for (auto c : {TensorClass::kWeight, TensorClass::kNorm, TensorClass::kEmbedding, TensorClass::kOptimizer})
    EXPECT_EQ(ref->stored_dtype(c, DType::kBF16), DType::kF32);
}

TEST(ProfileParse, LoadProfileFile) {
  const auto dir = testing::fresh_temp_dir("profile_load");
  const std::string path = (dir / "mine.json").string();
  std::ofstream(path) << good().dump();
  auto p = load_profile("", path);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->name, "mine");
  json bad = good();
  bad["orientation"] = "sideways";
  std::ofstream(path) << bad.dump();
  p = load_profile("", path);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), "ProfileBadValue");
  EXPECT_NE(p.status().message().find(path), std::string::npos) << p.status().message();
  EXPECT_NE(p.status().message().find("\"sideways\""), std::string::npos) << p.status().message();
  auto b = load_profile("megatron-legacy");
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(b->qkv, QkvPacking::kMegatronGroups);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ckpt
