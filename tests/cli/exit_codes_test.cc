// Exit codes that formats/base/error_codes.cc corrected: one rule, one kind, one exit code, wherever
// the rule is found. Each case names the command and the exit code it gave before the table.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_run.h"
#include "formats/digest/digest.h"
#include "formats/store/manifest.h"
#include "tests/temp_dir.h"

namespace {

namespace fs = std::filesystem;
using ckpt::testing::CmdResult;
using ckpt::testing::run_ckpt;

class ExitCodes : public ckpt::testing::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    std::string err;
    src_ = ckpt::testing::train_tiny(root_, &err);
    ASSERT_FALSE(src_.empty()) << err;
  }

  // A copy of the trained checkpoint whose manifest.json `edit` changed, resealed with its manifest
  // checksum (version 3) so that the rule under test, not the checksum, meets the edit.
  template <typename F>
  fs::path edited(const std::string& name, F edit) {
    const fs::path d = root_ / name;
    fs::copy(src_, d, fs::copy_options::recursive);
    nlohmann::json m;
    std::ifstream(d / "manifest.json") >> m;
    edit(m);
    if (m.contains("manifest_digest")) {
      m.erase("manifest_digest");
      const std::string text = ckpt::store::canonical_manifest_text(m);
      m["manifest_digest"] = ckpt::digest_of(ckpt::DigestAlgo::kXxh3_128, text.data(), text.size()).to_string();
    }
    std::ofstream(d / "manifest.json", std::ios::trunc) << m.dump();
    return d;
  }
  CmdResult reshard(const fs::path& d) {
    return run_ckpt({"reshard", d.string(), (root_ / "out").string(), "--tp", "1", "--pp", "1", "--dp", "1"}, root_ / "err");
  }

  fs::path src_;
};

// The model config says intermediate_size 180, the stored MLP weights are 176 wide: the file's
// content contradicts itself (corruption, 3). Was ShapeMismatch as kMismatch: exit 1, the code of
// "checkpoints differ".
TEST_F(ExitCodes, ShapeMismatchAgainstTheConfigIsCorruption) {
  const fs::path d = edited("shape", [](nlohmann::json& m) { m["model_config"]["intermediate_size"] = 180; });
  CmdResult r = reshard(d);
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_NE(r.err.find("ShapeMismatch"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(root_ / "out"));
}

// The checkpoint holds a tensor its model does not have: corruption (3). Was UnknownTensor as
// kInvalidArgument: exit 2, the code of a usage error, though the user asked for nothing wrong.
TEST_F(ExitCodes, TensorNotOfTheModelIsCorruption) {
  const fs::path d = edited("unknown", [](nlohmann::json& m) {
    for (auto& t : m["tensors"])
      if (t["name"] == "model.norm.weight") t["name"] = "model.extra.weight";
    for (auto& p : m["pieces"])
      if (p["tensor"] == "model.norm.weight") p["tensor"] = "model.extra.weight";
  });
  CmdResult r = reshard(d);
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_NE(r.err.find("UnknownTensor"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(root_ / "out"));
}

// A --layout file that is not JSON breaks the file's rules (3). Was InvalidArgument: exit 2.
TEST_F(ExitCodes, LayoutFileNotJsonIsCorruption) {
  const fs::path lf = root_ / "layout.json";
  std::ofstream(lf) << R"({"tp": 1, "pp": 1,)";
  CmdResult r = run_ckpt({"reshard", src_.string(), (root_ / "out").string(), "--layout", lf.string()}, root_ / "err");
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_NE(r.err.find("InvalidJson"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("layout.json"), std::string::npos) << r.err;
  // A well-formed file asking for an impossible layout stays a usage error (2).
  std::ofstream(lf, std::ios::trunc) << R"({"tp": 0, "pp": 1, "dp": 1})";
  r = run_ckpt({"reshard", src_.string(), (root_ / "out").string(), "--layout", lf.string()}, root_ / "err");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_FALSE(fs::exists(root_ / "out"));
}

}  // namespace
