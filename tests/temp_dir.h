// One scratch directory for tests: fresh_temp_dir() makes an empty directory under the system temp
// dir, unique per process and call; TempDirTest is a gtest fixture that makes one (root_) before
// each test and removes it after.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>

namespace ckpt::testing {

// "<tmp>/ckpt_<tag>_<pid>_<random>", created empty.
inline std::filesystem::path fresh_temp_dir(const std::string& tag) {
  namespace fs = std::filesystem;
  const fs::path d = fs::temp_directory_path() /
                     ("ckpt_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(std::random_device{}()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override { root_ = fresh_temp_dir(::testing::UnitTest::GetInstance()->current_test_info()->name()); }
  void TearDown() override { std::filesystem::remove_all(root_); }
  std::filesystem::path root_;
};

}  // namespace ckpt::testing
