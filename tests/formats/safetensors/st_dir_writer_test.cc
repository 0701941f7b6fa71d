// SafetensorsDirWriter: files one subdirectory deep and side files appear at `out` only at commit;
// abort removes everything it created (and nothing else); bad names and an existing output are
// refused; write_at fills a tensor in parts in any order.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "formats/safetensors/st_dir.h"
#include "tests/temp_dir.h"

namespace ckpt::safetensors {
namespace {

namespace fs = std::filesystem;

class DirWriterTest : public ckpt::testing::TempDirTest {
 protected:
  const std::vector<TensorMeta> metas_{{"w", DType::kF32, {2, 3}}};
  const std::vector<Piece> pieces_{{"w", Region{Box::whole({2, 3})}, DType::kF32}};
};

TEST_F(DirWriterTest, CommitsSubdirectoryFilesAndSideFiles) {
  const std::string out = (root_ / "out").string();
  SafetensorsDirWriter d(out, true);
  ASSERT_TRUE(d.create().ok());
  auto w = d.add_file("mp_rank_00/model.safetensors", metas_, pieces_);
  ASSERT_TRUE(w.ok());
  const float second_row[3] = {4, 5, 6}, first_row[3] = {1, 2, 3};
  ASSERT_TRUE((*w)->write_at(0, 3, second_row, 3).ok());  // parts in reverse order
  EXPECT_FALSE((*w)->write_at(0, 4, first_row, 3).ok());  // past the end
  ASSERT_TRUE((*w)->write_at(0, 0, first_row, 3).ok());
  EXPECT_FALSE(fs::exists(out));
  ASSERT_TRUE(d.commit({{"args.json", "{}\n"}}, {}).ok());
  EXPECT_FALSE(fs::exists(out + ".partial"));
  auto f = SafetensorsFile::open(out + "/mp_rank_00/model.safetensors");
  ASSERT_TRUE(f.ok());
  float got[6];
  ASSERT_TRUE((*f)->read(0, Box::whole({2, 3}), got).ok());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(got[i], i + 1);
  std::ifstream in(out + "/args.json");
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(ss.str(), "{}\n");
}

TEST_F(DirWriterTest, AbortRemovesWhatItCreated) {
  const std::string out = (root_ / "out").string();
  {
    SafetensorsDirWriter d(out, false);
    ASSERT_TRUE(d.create().ok());
    ASSERT_TRUE(d.add_file("a/x.safetensors", metas_, pieces_).ok());
    ASSERT_TRUE(d.add_file("y.safetensors", metas_, pieces_).ok());
    EXPECT_FALSE(d.commit({}, {}).ok());  // tensors incomplete
  }  // destructor aborts
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + ".partial"));
}

TEST_F(DirWriterTest, RefusesBadNamesAndExistingOutput) {
  const std::string out = (root_ / "out").string();
  SafetensorsDirWriter d(out, false);
  ASSERT_TRUE(d.create().ok());
  for (const char* bad : {"", "/abs.safetensors", "../up.safetensors", "a/b/c.safetensors", "a/../b.safetensors"})
    EXPECT_FALSE(d.add_file(bad, metas_, pieces_).ok()) << bad;
  SafetensorsDirWriter again(out, false);
  EXPECT_FALSE(again.create().ok());  // out.partial exists
  fs::create_directories(root_ / "full" / "x");
  SafetensorsDirWriter full((root_ / "full").string(), false);
  EXPECT_FALSE(full.create().ok());
}

}  // namespace
}  // namespace ckpt::safetensors
