// The commit-protocol helpers, checked on a real directory with std::filesystem as the oracle:
// PartialDir refuses an existing target (or allows an empty one), refuses or replaces a stale
// NAME.partial as its policy says, removes what it built unless committed or released, and
// commit() leaves exactly NAME with the contents; write_file_atomic leaves no temp file behind.
#include "formats/base/fs_util.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include "tests/temp_dir.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;

std::string temp_root() {
  return ckpt::testing::fresh_temp_dir("fsutil").string();
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(PartialDir, CommitRenamesAndRefusesAnExistingTarget) {
  const std::string root = temp_root();
  const std::string out = root + "/out";
  {
    PartialDir d(out + "/");  // a trailing '/' names the same directory
    EXPECT_EQ(d.path(), out + ".partial");
    ASSERT_TRUE(d.create().ok());
    ASSERT_TRUE(write_file(d.path() + "/a.txt", "hello", /*fsync=*/true).ok());
    ASSERT_TRUE(d.commit(/*fsync=*/true).ok());
  }
  EXPECT_FALSE(fs::exists(out + ".partial"));
  EXPECT_EQ(slurp(out + "/a.txt"), "hello");
  PartialDir again(out);
  Status st = again.create();
  EXPECT_EQ(st.kind(), ErrorKind::kInvalidArgument);
  EXPECT_NE(st.message().find("already exists"), std::string::npos) << st.to_string();
  EXPECT_FALSE(fs::exists(out + ".partial"));
  fs::remove_all(root);
}

TEST(PartialDir, RemovedUnlessCommittedOrReleased) {
  const std::string root = temp_root();
  {
    PartialDir d(root + "/x");
    ASSERT_TRUE(d.create().ok());
    ASSERT_TRUE(write_file(d.path() + "/f", "1", false).ok());
  }  // destroyed without commit: an error path
  EXPECT_FALSE(fs::exists(root + "/x.partial"));
  {
    PartialDir d(root + "/y");
    ASSERT_TRUE(d.create().ok());
    d.release();  // someone else commits it
  }
  EXPECT_TRUE(fs::is_directory(root + "/y.partial"));
  PartialDir other(root + "/y");  // not created by this object: committing it is fine
  ASSERT_TRUE(other.commit(false).ok());
  EXPECT_TRUE(fs::is_directory(root + "/y"));
  EXPECT_FALSE(fs::exists(root + "/y.partial"));
  fs::remove_all(root);
}

TEST(PartialDir, StaleAndEmptyTargetPolicies) {
  const std::string root = temp_root();
  fs::create_directories(root + "/s.partial/junk");
  PartialDir refuse(root + "/s");
  EXPECT_NE(refuse.create().message().find("remove it first"), std::string::npos);
  EXPECT_TRUE(fs::exists(root + "/s.partial/junk"));  // a refused create touches nothing
  PartialDir replace(root + "/s", PartialDirPolicy{.replace_stale = true});
  ASSERT_TRUE(replace.create().ok());
  EXPECT_FALSE(fs::exists(root + "/s.partial/junk"));
  replace.remove();
  EXPECT_FALSE(fs::exists(root + "/s.partial"));

  fs::create_directories(root + "/e");  // an empty target directory
  PartialDir strict(root + "/e");
  EXPECT_FALSE(strict.create().ok());
  PartialDir lenient(root + "/e", PartialDirPolicy{.empty_target_ok = true});
  ASSERT_TRUE(lenient.create().ok());
  ASSERT_TRUE(write_file(lenient.path() + "/g", "2", false).ok());
  ASSERT_TRUE(lenient.commit(false).ok());
  EXPECT_EQ(slurp(root + "/e/g"), "2");
  fs::create_directories(root + "/n/sub");  // not empty: refused even when empty targets are allowed
  PartialDir full(root + "/n", PartialDirPolicy{.empty_target_ok = true});
  EXPECT_NE(full.create().message().find("not an empty directory"), std::string::npos);
  fs::remove_all(root);
}

TEST(FsUtil, WriteFileAtomicReplacesAndLeavesNoTemp) {
  const std::string root = temp_root();
  const std::string f = root + "/latest";
  ASSERT_TRUE(write_file_atomic(f, "step-1\n").ok());
  ASSERT_TRUE(write_file_atomic(f, "step-2\n").ok());
  EXPECT_EQ(slurp(f), "step-2\n");
  EXPECT_FALSE(fs::exists(temp_path_for(f)));
  std::string got;
  ASSERT_TRUE(read_small_file(f, 100, &got).ok());
  EXPECT_EQ(got, "step-2\n");
  EXPECT_EQ(read_small_file(f, 3, &got).code(), "FileTooLarge");
  EXPECT_EQ(fs::directory_iterator(root)->path().filename(), "latest");  // the only entry
  fs::remove_all(root);
}

}  // namespace
}  // namespace ckpt
