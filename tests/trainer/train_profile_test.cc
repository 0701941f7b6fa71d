// trainer/train_profile.h: the F32 dtype rule and which profile a run saves in, from hand-written
// cluster files (one test per rule; the end-to-end runs are tests/python/test_train_profile_resume.py),
// and `ckpt plan` refusing an unknown profile name with the same error.
#include "trainer/plan/plan_job.h"
#include "trainer/train_profile.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace ckpt::trainer {
namespace train_profile_test {  // named, not anonymous: unique in a unity batch

LlamaConfig tiny_config() {  // 4 heads, 2 KV heads (GQA), 4 layers
  auto c = LlamaConfig::from_file(std::string(CKPT_SOURCE_DIR) + "/fixtures/tiny_llama.json");
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return *c;
}

// A cluster file with one device type per (name, profile) pair ("" = none), one rank each.
std::string write_cluster(const std::string& tag, const std::vector<std::pair<std::string, std::string>>& types) {
  nlohmann::json j = {{"device_types", nlohmann::json::array()}, {"ranks", nlohmann::json::array()}};
  for (const auto& [name, profile] : types) {
    nlohmann::json t = {{"name", name}, {"memory", "1GiB"}};
    if (!profile.empty()) t["profile"] = profile;
    j["device_types"].push_back(t);
    j["ranks"].push_back({{"type", name}, {"count", 1}});
  }
  const std::string path =
      (std::filesystem::temp_directory_path() / ("ckpt_train_profile_test_" + tag + ".json")).string();
  std::ofstream(path) << j.dump();
  return path;
}

Layout pp_layout(int pp) {
  auto l = Layout::make(1, pp, 1, 0, 4);
  EXPECT_TRUE(l.ok());
  return *l;
}

TEST(TrainProfile, StorageProfileRaisesEveryDtypeToF32) {
  auto mc = builtin_profile("megatron-mcore");
  ASSERT_TRUE(mc.ok());
  const Profile s = trainer_storage_profile(*mc);
  EXPECT_EQ(s.name, "megatron-mcore.fp32");
  for (TensorClass c : {TensorClass::kWeight, TensorClass::kNorm, TensorClass::kEmbedding, TensorClass::kOptimizer})
    EXPECT_EQ(s.stored_dtype(c, DType::kF32), DType::kF32);
  EXPECT_EQ(s.qkv, mc->qkv);
  EXPECT_EQ(s.names, mc->names);
  EXPECT_EQ(s.vocab.multiple, mc->vocab.multiple);
  // All-F32 or "keep" profiles keep their name.
  for (const char* name : {"libai", "reference", "hf"}) {
    auto p = builtin_profile(name);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(trainer_storage_profile(*p).name, name);
  }
}

TEST(TrainProfile, NoClusterOrNoProfileIsCanonical) {
  auto none = train_profile("", tiny_config(), pp_layout(2));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->active);
  auto plain = train_profile(write_cluster("plain", {{"a", ""}, {"b", ""}}), tiny_config(), pp_layout(2));
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_FALSE(plain->active);
  EXPECT_NE(plain->note.find("canonical"), std::string::npos) << plain->note;
}

TEST(TrainProfile, EveryRankNamingOneProfileSavesInIt) {
  auto r = train_profile(write_cluster("same", {{"a", "paddlenlp"}, {"b", "paddlenlp"}}), tiny_config(), pp_layout(2));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r->active);
  EXPECT_EQ(r->named, "paddlenlp");
  EXPECT_EQ(r->profile.name, "paddlenlp");
  EXPECT_EQ(r->stored_layout.pp, 2);
}

TEST(TrainProfile, AMixIsCanonical) {
  // Two profiles; and one profile beside a type naming none (which counts as "reference").
  for (auto types : {std::vector<std::pair<std::string, std::string>>{{"a", "paddlenlp"}, {"b", "megatron-mcore"}},
                     std::vector<std::pair<std::string, std::string>>{{"a", "paddlenlp"}, {"b", ""}}}) {
    auto r = train_profile(write_cluster("mix", types), tiny_config(), pp_layout(2));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_FALSE(r->active);
    EXPECT_NE(r->note.find("different profiles"), std::string::npos) << r->note;
  }
}

TEST(TrainProfile, UnknownProfileNameIsRefusedNamingTheDeviceType) {
  // Also on a type that holds no rank of this run.
  const std::string f = write_cluster("unknown", {{"a", "paddlenlp"}, {"b", "no-such-stack"}});
  auto r = train_profile(f, tiny_config(), pp_layout(2));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), "ProfileUnknown") << r.status().to_string();
  EXPECT_NE(r.status().to_string().find("device type 'b'"), std::string::npos) << r.status().to_string();
  EXPECT_NE(r.status().to_string().find("megatron-mcore"), std::string::npos) << r.status().to_string();
}

TEST(TrainProfile, PlanRefusesAnUnknownProfileNameAsTrainDoes) {
  // `ckpt plan --cluster` (search and --evaluate) reads the same cluster files: the same named error.
  PlanRequest req;
  req.cluster = write_cluster("plan_unknown", {{"a", "paddlenlp"}, {"b", "no-such-stack"}});
  req.model = std::string(CKPT_SOURCE_DIR) + "/fixtures/tiny_llama.json";
  req.global_batch = 8;
  auto s = search_plan(req);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), "ProfileUnknown") << s.status().to_string();
  EXPECT_NE(s.status().to_string().find("device type 'b'"), std::string::npos) << s.status().to_string();
  req.evaluate = "unused.json";  // refused before the layout file is read
  auto e = evaluate_plan(req);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), "ProfileUnknown") << e.status().to_string();
  // A known profile passes the check (the search then runs on the tiny model).
  req.cluster = write_cluster("plan_known", {{"a", "paddlenlp"}, {"b", "megatron-mcore"}});
  req.evaluate.clear();
  auto ok = search_plan(req);
  if (!ok.ok()) {
    EXPECT_NE(ok.status().code(), "ProfileUnknown") << ok.status().to_string();
  }
}

TEST(TrainProfile, AsymmetricLayoutIsRefused) {
  auto l = Layout::from_pipelines({PipelineSpec{1, {StageSpec{2, 1, ""}, StageSpec{2, 1, ""}}},
                                   PipelineSpec{1, {StageSpec{1, 1, ""}, StageSpec{3, 1, ""}}}},
                                  0);
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  const std::string f = write_cluster("asym", {{"a", "megatron-mcore"}, {"b", "megatron-mcore"},
                                                {"c", "megatron-mcore"}, {"d", "megatron-mcore"}});
  auto r = train_profile(f, tiny_config(), *l);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), "Unsupported") << r.status().to_string();
  EXPECT_NE(r.status().message().find("symmetric"), std::string::npos) << r.status().message();
}

TEST(TrainProfile, ProfileTheModelCannotUseIsRefused) {
  // LiBai's per-head qkv needs as many KV heads as heads; tiny_llama is GQA.
  auto r = train_profile(write_cluster("libai", {{"a", "libai"}, {"b", "libai"}}), tiny_config(), pp_layout(2));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), "ProfileUnsupported") << r.status().to_string();
}

}  // namespace train_profile_test
}  // namespace ckpt::trainer
