// The flag text of the jobs parsed at the edge (converters/jobs/job_flags.h, reshard/layout/
// layout_values.h) and the target layout a reshard plans for (reshard_target_layout): values in
// bytes, enums and lists as the flags mean them, and every bad value refused naming its flag.
#include "converters/jobs/job_flags.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "converters/jobs/reshard_job.h"
#include "reshard/layout/layout_values.h"

namespace ckpt {
namespace {

bool names(const Status& st, const std::string& flag) { return st.message().find(flag) != std::string::npos; }

TEST(JobFlags, MaxMemoryAndShardSizeInBytesErrorsNameTheFlag) {
  EXPECT_EQ(*parse_max_memory("256M"), uint64_t{256} << 20);
  EXPECT_EQ(*parse_max_memory("1048576"), uint64_t{1} << 20);
  EXPECT_EQ(*parse_max_shard_size("5GB"), uint64_t{5000000000});
  EXPECT_EQ(*parse_max_shard_size("2GiB"), uint64_t{2} << 30);
  for (const char* bad : {"lots", "0", "-1", "12Q", ""}) {
    auto m = parse_max_memory(bad);
    ASSERT_FALSE(m.ok()) << bad;
    EXPECT_EQ(m.status().kind(), ErrorKind::kInvalidArgument);
    EXPECT_TRUE(names(m.status(), "--max-memory")) << m.status().to_string();
    auto s = parse_max_shard_size(bad);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_TRUE(names(s.status(), "--max-shard-size")) << s.status().to_string();
  }
}

TEST(JobFlags, StoreFlagsSetCodecDigestAndIo) {
  auto so = parse_store_flags("shuffle+zstd:5", "sha256", "direct");
  ASSERT_TRUE(so.ok()) << so.status().to_string();
  EXPECT_EQ(so->codec, store::Codec::kShuffleZstd);
  EXPECT_EQ(so->zstd_level, 5);
  EXPECT_EQ(so->digest, DigestAlgo::kSha256);
  EXPECT_EQ(so->io, IoMode::kDirect);
  auto plain = parse_store_flags("none", "xxh3-128", "auto");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->codec, store::Codec::kNone);
  EXPECT_EQ(plain->digest, DigestAlgo::kXxh3_128);
  EXPECT_EQ(plain->io, IoMode::kAuto);
}

TEST(JobFlags, StoreFlagsErrorsNameTheFlagInFlagOrder) {
  EXPECT_TRUE(names(parse_store_flags("lz4", "xxh3-128", "auto").status(), "--compress"));
  EXPECT_TRUE(names(parse_store_flags("zstd:99", "xxh3-128", "auto").status(), "--compress"));
  EXPECT_TRUE(names(parse_store_flags("none", "md5", "auto").status(), "--digest"));
  EXPECT_TRUE(names(parse_store_flags("none", "xxh3-128", "fast").status(), "--io"));
  // Several bad values: the first flag's error, as the CLI reports them.
  EXPECT_TRUE(names(parse_store_flags("lz4", "md5", "fast").status(), "--compress"));
  EXPECT_TRUE(names(parse_store_flags("none", "md5", "fast").status(), "--digest"));
}

TEST(JobFlags, IoAndDtype) {
  EXPECT_EQ(*parse_io_flag("buffered"), IoMode::kBuffered);
  EXPECT_TRUE(names(parse_io_flag("x").status(), "--io"));
  EXPECT_FALSE(float_dtype_flag("")->has_value());
  EXPECT_EQ(**float_dtype_flag("bf16"), DType::kBF16);
  EXPECT_EQ(**float_dtype_flag("fp32"), DType::kF32);
  EXPECT_TRUE(names(float_dtype_flag("int8").status(), "--dtype"));
}

TEST(LayoutValuesParse, PpLayersParsedOnceNoneGivenIsNone) {
  auto v = LayoutValues::parse(2, 3, 1, 1, "2,3,3");
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_EQ(v->pp_layers, (std::vector<int>{2, 3, 3}));
  EXPECT_TRUE(v->given());
  auto none = LayoutValues::parse(0, 0, 0, -1, "");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->given());
  EXPECT_TRUE(LayoutValues::parse(0, 0, 0, -1, "1,2")->given());  // --pp-layers alone is given (and refused by make)
  for (const char* bad : {"1,x", "a", "1,,2", ","}) {
    auto b = LayoutValues::parse(1, 2, 1, -1, bad);
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_TRUE(names(b.status(), "--pp-layers")) << b.status().to_string();
  }
}

TEST(LayoutValuesMake, NeedsTpPpDpAndSplitsTheLayers) {
  auto partial = LayoutValues{2, 0, 0, -1, {}}.make(4);
  ASSERT_FALSE(partial.ok());
  EXPECT_TRUE(names(partial.status(), "--tp N --pp N --dp N"));
  auto even = LayoutValues{1, 2, 1, -1, {}}.make(5);
  ASSERT_TRUE(even.ok()) << even.status().to_string();
  EXPECT_EQ(even->layers_in_stage(0), 3);  // earlier stages take the remainder
  EXPECT_EQ(even->layers_in_stage(1), 2);
  EXPECT_EQ(even->zero, 0);  // not given: 0
  auto uneven = LayoutValues{1, 2, 2, 1, {1, 3}}.make(4);
  ASSERT_TRUE(uneven.ok());
  EXPECT_EQ(uneven->layers_in_stage(0), 1);
  EXPECT_EQ(uneven->zero, 1);
  EXPECT_FALSE((LayoutValues{1, 2, 1, -1, {1, 1}}.make(4)).ok());  // sums to 2 of 4 layers
}

class TargetLayout : public ::testing::Test {
 protected:
  void SetUp() override {
    cfg_.num_hidden_layers = 4;
    src_meta_ = {{"layout", {{"tp", 1}, {"pp", 1}, {"dp", 1}, {"zero", 0}, {"layers_per_stage", {4}},
                             {"vocab_divisor", 64}, {"profile", "megatron-mcore"}}}};
    file_ = (std::filesystem::path(::testing::TempDir()) / "target_layout.json").string();
    std::ofstream(file_) << R"({"tp": 2, "pp": 2, "dp": 1, "zero": 0, "layers_per_stage": [1, 3]})";
  }
  void TearDown() override { std::remove(file_.c_str()); }
  LlamaConfig cfg_;
  nlohmann::json src_meta_;
  std::string file_;
};

TEST_F(TargetLayout, FileParsedAtTheEdgeIsTakenAsIs) {
  ReshardRequest r;
  auto l = parse_layout_file(file_);
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  r.layout_file = *l;
  auto t = reshard_target_layout(r, cfg_, src_meta_);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->tp, 2);
  EXPECT_EQ(t->layers_in_stage(0), 1);
  EXPECT_EQ(t->vocab_divisor, 128);  // the file's (its default), not the source's
  EXPECT_FALSE(parse_layout_file("")->has_value());
  EXPECT_FALSE(parse_layout_file(file_ + ".missing").ok());
}

TEST_F(TargetLayout, FileExcludesTheFlags) {
  ReshardRequest r;
  r.layout_file = *parse_layout_file(file_);
  r.layout.tp = 2;
  auto t = reshard_target_layout(r, cfg_, src_meta_);
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(names(t.status(), "--layout FILE excludes"));
}

TEST_F(TargetLayout, FlagsKeepTheSourcesVocabDivisorAndProfile) {
  ReshardRequest r;
  r.layout = {2, 1, 1, -1, {}};
  auto t = reshard_target_layout(r, cfg_, src_meta_);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->tp, 2);
  EXPECT_EQ(t->vocab_divisor, 64);
  EXPECT_EQ(t->profile, "megatron-mcore");
}

TEST_F(TargetLayout, NeitherGivenIsRefusedUnlessAConversionKeepsTheSourceLayout) {
  ReshardRequest r;
  EXPECT_TRUE(names(reshard_target_layout(r, cfg_, src_meta_).status(), "give --layout FILE"));
  r.profile.profile = "hf";
  auto kept = reshard_target_layout(r, cfg_, src_meta_);
  ASSERT_TRUE(kept.ok()) << kept.status().to_string();
  EXPECT_EQ(kept->to_json(), Layout::from_json(src_meta_["layout"])->to_json());
  EXPECT_FALSE(reshard_target_layout(r, cfg_, nlohmann::json::object()).ok());  // no source layout to keep
}

}  // namespace
}  // namespace ckpt
