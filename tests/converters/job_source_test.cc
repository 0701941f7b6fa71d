// A job's SRC located once (converters/source/job_source.h): its kind detected, a run dir's `latest`
// followed once (what open() opens even when `latest` moves afterwards), what cannot be resolved
// or recognised returned by open() as open_checkpoint says it, and the questions asked before
// opening (cold, copy_checkable) answered from the located checkpoint.
#include "converters/source/job_source.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <vector>

#include "formats/base/fs_util.h"
#include "formats/store/run_dir.h"
#include "formats/store/store_writer.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;

// A one-tensor native checkpoint at `dst` (f32 [4, 3], values 0..11).
void write_store(const std::string& dst, store::Codec codec = store::Codec::kNone) {
  store::StoreOptions o;
  o.codec = codec;
  o.fsync = false;
  store::StoreWriter w(dst, o);
  const std::vector<TensorMeta> metas = {{"model.norm.weight", DType::kF32, {4, 3}}};
  const std::vector<Piece> pieces = {{"model.norm.weight", Region{Box::whole({4, 3}), 0, -1}, DType::kF32}};
  ASSERT_TRUE(w.begin(metas, pieces, {{"profile", "reference"}}).ok());
  std::vector<float> v(12);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  ASSERT_TRUE(w.write(0, v.data(), 12).ok());
  ASSERT_TRUE(w.commit().ok());
}

class JobSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) / ("job_source_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "run");
    write_store((root_ / "run" / "step-00000001").string());
    write_store((root_ / "run" / "step-00000002").string());
    ASSERT_TRUE(store::write_latest((root_ / "run").string(), "step-00000001").ok());
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string at(const std::string& rel) const { return (root_ / rel).string(); }
  fs::path root_;
};

TEST_F(JobSourceTest, RunDirResolvedOnceToTheCheckpointLatestNames) {
  const JobSource s = JobSource::locate(at("run"));
  ASSERT_NE(s.kind, nullptr);
  EXPECT_STREQ(s.kind->name, "native-store");
  EXPECT_TRUE(s.native_store());
  EXPECT_TRUE(s.resolved.ok());
  EXPECT_EQ(s.path, at("run"));
  EXPECT_EQ(s.dir, at("run/step-00000001"));
  // `latest` moves after SRC was located: the job still opens the checkpoint it located.
  ASSERT_TRUE(store::write_latest(at("run"), "step-00000002").ok());
  auto src = s.open(/*as_stored=*/true);
  ASSERT_TRUE(src.ok()) << src.status().to_string();
  EXPECT_EQ((*src)->describe(), at("run/step-00000001"));
  EXPECT_EQ((*src)->pieces().size(), 1u);
}

TEST_F(JobSourceTest, AnUnresolvableRunDirIsReturnedByOpen) {
  fs::create_directories(root_ / "bad");
  ASSERT_TRUE(write_file_atomic(at("bad/latest"), "../x\n").ok());
  const JobSource s = JobSource::locate(at("bad"));
  EXPECT_TRUE(s.native_store());
  EXPECT_FALSE(s.resolved.ok());
  EXPECT_EQ(s.dir, at("bad"));
  auto src = s.open();
  ASSERT_FALSE(src.ok());
  EXPECT_EQ(src.status().code(), "BadLatest") << src.status().to_string();
  EXPECT_FALSE(s.copy_checkable());
}

TEST_F(JobSourceTest, NoKindOpensAsOpenCheckpointRefusesIt) {
  const JobSource missing = JobSource::locate(at("nothing"));
  EXPECT_EQ(missing.kind, nullptr);
  EXPECT_FALSE(missing.native_store());
  EXPECT_EQ(missing.open().status().kind(), ErrorKind::kNotFound);
  fs::create_directories(root_ / "empty");
  const JobSource empty = JobSource::locate(at("empty"));
  EXPECT_EQ(empty.kind, nullptr);
  auto e = empty.open();
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("is no checkpoint kind ckpt reads"), std::string::npos) << e.status().to_string();
}

TEST_F(JobSourceTest, CopyCheckableOnlyUncompressedAndCopiedAsStored) {
  EXPECT_TRUE(JobSource::locate(at("run")).copy_checkable());
  ProfileRequest convert;
  convert.profile = "hf";
  EXPECT_FALSE(JobSource::locate(at("run")).copy_checkable(convert));  // profile views compute their pieces
  write_store(at("zstd"), store::Codec::kShuffleZstd);
  EXPECT_FALSE(JobSource::locate(at("zstd")).copy_checkable());  // decoded, not copied from file ranges
}

TEST_F(JobSourceTest, ColdIsAskedOnlyUnderAuto) {
  const JobSource s = JobSource::locate(at("run"));
  EXPECT_FALSE(s.cold(IoMode::kBuffered));
  EXPECT_FALSE(s.cold(IoMode::kDirect));
}

}  // namespace
}  // namespace ckpt
