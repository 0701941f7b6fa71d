// Hostile JSON in every JSON file ckpt reads, through the CLI as a user meets it: manifest.json
// (verify, inspect, reshard, to-hf), config.json (from-hf, inspect, train --config), the
// safetensors index (from-hf, inspect, verify), a --layout file (reshard) and megatron_args.json
// (reshard of a Megatron directory). Nested 200,000 deep, larger than its limit (a sparse file)
// and with a duplicate key, each must exit 3 naming the rule and the file, leave no output behind,
// and (in the ASan+UBSan build, where CKPT_BIN is the sanitized binary) raise no sanitizer report.
// Fixtures come from the CLI itself: train a tiny LLaMA, export it to HF and Megatron.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_run.h"

namespace {

namespace fs = std::filesystem;

using ckpt::testing::CmdResult;
using ckpt::testing::run_ckpt;

struct Hostile {
  const char* name;
  const char* rule;
};
const Hostile kHostile[] = {{"deep", "JsonTooDeep"}, {"huge", "JsonTooLarge"}, {"dup", "DuplicateKey"}};

// Writes the hostile variant `h` to `p`.
void write_hostile(const fs::path& p, const std::string& h) {
  fs::remove(p);
  std::ofstream f(p, std::ios::binary);
  if (h == "deep") {
    f << "{\"a\":" << std::string(200000, '[') << std::string(200000, ']') << "}";
  } else if (h == "dup") {
    f << R"({"format":"ckpt-native","version":1,"tp":1,"tp":1,"weight_map":{},"weight_map":{}})";
  } else {
    f << "{}";
    f.close();
    fs::resize_file(p, uint64_t{1} << 34);  // sparse, 16 GiB: above every limit, never read
  }
}

class JsonCliBadFiles : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new fs::path(fs::temp_directory_path() / ("ckpt_json_cli_" + std::to_string(::getpid())));
    fs::remove_all(*root_);
    fs::create_directories(*root_);
    std::string terr;
    *native_() = ckpt::testing::train_tiny(*root_, &terr);
    ASSERT_FALSE(native_()->empty()) << terr;
    const fs::path err = *root_ / "setup.err";
    const std::vector<std::vector<std::string>> setup = {
        {"to-hf", (*root_ / "run").string(), (*root_ / "hf").string(), "--max-shard-size", "100KB", "--no-fsync"},
        {"export-megatron", (*root_ / "run").string(), (*root_ / "meg").string(), "--tp", "1", "--pp", "1"},
    };
    for (const auto& c : setup) {
      CmdResult r = run_ckpt(c, err);
      ASSERT_EQ(r.code, 0) << c[0] << ": " << r.err;
    }
    ASSERT_TRUE(fs::exists(*native_() / "manifest.json"));
    ASSERT_TRUE(fs::exists(*root_ / "hf" / "model.safetensors.index.json"));
    ASSERT_TRUE(fs::exists(*root_ / "meg" / "megatron_args.json"));
  }
  static void TearDownTestSuite() {
    fs::remove_all(*root_);
    delete root_;
  }
  static fs::path* native_() {
    static fs::path p;
    return &p;
  }

  // A fresh copy of the fixture dir `from` with `file` replaced by the hostile variant `h`.
  static fs::path copy_with(const fs::path& from, const std::string& name, const std::string& file, const std::string& h) {
    const fs::path d = *root_ / name;
    fs::remove_all(d);
    fs::copy(from, d, fs::copy_options::recursive);
    write_hostile(d / file, h);
    return d;
  }

  // Each command must exit 3 naming `rule` and `file`, without sanitizer reports or output.
  static void expect_refused(const std::string& name, const std::vector<std::vector<std::string>>& cmds,
                             const std::string& rule, const std::string& file, const fs::path& out) {
    for (const auto& c : cmds) {
      SCOPED_TRACE(name + ": ckpt " + c[0]);
      CmdResult r = run_ckpt(c, *root_ / (name + ".err"));
      EXPECT_EQ(r.code, 3) << r.err;
      EXPECT_NE(r.err.find(rule), std::string::npos) << "stderr does not name " << rule << ":\n" << r.err.substr(0, 2000);
      EXPECT_NE(r.err.find(file), std::string::npos) << "stderr does not name " << file << ":\n" << r.err.substr(0, 2000);
      EXPECT_EQ(r.err.find("Sanitizer"), std::string::npos) << r.err.substr(0, 2000);
      EXPECT_EQ(r.err.find("runtime error"), std::string::npos) << r.err.substr(0, 2000);
      EXPECT_FALSE(fs::exists(out)) << out;
      EXPECT_FALSE(fs::exists(out.string() + ".partial")) << out;
    }
  }

  static fs::path* root_;
};
fs::path* JsonCliBadFiles::root_ = nullptr;

TEST_F(JsonCliBadFiles, Manifest) {
  for (const auto& h : kHostile) {
    const std::string name = std::string("manifest_") + h.name;
    const fs::path d = copy_with(*native_(), name, "manifest.json", h.name);
    const fs::path out = *root_ / (name + "_out");
    expect_refused(name,
                   {{"verify", d.string()},
                    {"inspect", d.string()},
                    {"reshard", d.string(), out.string(), "--tp", "1", "--pp", "1", "--dp", "1"},
                    {"to-hf", d.string(), out.string(), "--no-fsync"}},
                   h.rule, "manifest.json", out);
  }
}

TEST_F(JsonCliBadFiles, ConfigJson) {
  for (const auto& h : kHostile) {
    const std::string name = std::string("config_") + h.name;
    const fs::path d = copy_with(*root_ / "hf", name, "config.json", h.name);
    const fs::path out = *root_ / (name + "_out");
    expect_refused(name,
                   {{"from-hf", d.string(), out.string(), "--no-fsync"},
                    {"inspect", d.string()},
                    {"train", "--config", (d / "config.json").string(), "--steps", "1", "--out", out.string()}},
                   h.rule, "config.json", out);
  }
}

TEST_F(JsonCliBadFiles, SafetensorsIndex) {
  for (const auto& h : kHostile) {
    const std::string name = std::string("index_") + h.name;
    const fs::path d = copy_with(*root_ / "hf", name, "model.safetensors.index.json", h.name);
    const fs::path out = *root_ / (name + "_out");
    expect_refused(name,
                   {{"from-hf", d.string(), out.string(), "--no-fsync"}, {"inspect", d.string()}, {"verify", d.string()}},
                   h.rule, "model.safetensors.index.json", out);
  }
}

TEST_F(JsonCliBadFiles, LayoutFile) {
  for (const auto& h : kHostile) {
    const std::string name = std::string("layout_") + h.name;
    const fs::path lf = *root_ / (name + ".json");
    write_hostile(lf, h.name);
    const fs::path out = *root_ / (name + "_out");
    expect_refused(name, {{"reshard", native_()->string(), out.string(), "--layout", lf.string()}}, h.rule, lf.filename().string(), out);
  }
}

TEST_F(JsonCliBadFiles, MegatronArgs) {
  for (const auto& h : kHostile) {
    const std::string name = std::string("megatron_") + h.name;
    const fs::path d = copy_with(*root_ / "meg", name, "megatron_args.json", h.name);
    const fs::path out = *root_ / (name + "_out");
    expect_refused(name, {{"reshard", d.string(), out.string(), "--tp", "1", "--pp", "1", "--dp", "1"}}, h.rule,
                   "megatron_args.json", out);
  }
}

// The harness passes the untouched fixtures (so the refusals above are the JSON's doing).
TEST_F(JsonCliBadFiles, HarnessAcceptsTheFixtures) {
  const fs::path err = *root_ / "ok.err";
  EXPECT_EQ(run_ckpt({"verify", native_()->string()}, err).code, 0);
  EXPECT_EQ(run_ckpt({"inspect", (*root_ / "hf").string()}, err).code, 0);
  const fs::path lf = *root_ / "layout_ok.json";
  std::ofstream(lf) << R"({"tp":1,"pp":2,"dp":1,"zero":0,"layers_per_stage":[2,2]})";
  CmdResult r = run_ckpt({"reshard", native_()->string(), (*root_ / "ok_out").string(), "--layout", lf.string()}, err);
  EXPECT_EQ(r.code, 0) << r.err;
  r = run_ckpt({"reshard", (*root_ / "meg").string(), (*root_ / "ok_meg").string(), "--tp", "1", "--pp", "1", "--dp", "1"}, err);
  EXPECT_EQ(r.code, 0) << r.err;
}

}  // namespace
