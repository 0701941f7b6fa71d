// The bad-input matrix of docs/SAFETENSORS.md through the ckpt CLI (`from-hf`, `to-hf`,
// `inspect`, `verify`): one handcrafted file or index per rule of the reference reader, plus ckpt's stricter
// rules. Each must give the documented exit code (3 corrupt, 4 not found), name the rule and the
// file on stderr, leave no output behind, and (in the ASan+UBSan build, where CKPT_BIN is the
// sanitized binary) produce no sanitizer report. A valid file through the same harness must pass.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>
#include "tests/temp_dir.h"

namespace {

namespace fs = std::filesystem;

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return s;
}
std::string file_of(const std::string& header, const std::string& data) { return le64(header.size()) + header + data; }
std::string t(const std::string& name, const std::string& dtype, const std::string& shape, uint64_t b, uint64_t e) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" + std::to_string(b) + "," +
         std::to_string(e) + "]}";
}

void write(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct CmdResult {
  int code = -1;
  std::string err;
};

std::string quote(const std::string& s) { return "'" + s + "'"; }

// The ckpt binary of this build (CKPT_BIN), or $CKPT_BIN when set (e.g. a sanitized binary).
std::string ckpt_bin() {
  const char* env = std::getenv("CKPT_BIN");
  return env && *env ? env : CKPT_BIN;
}

CmdResult ckpt(const std::vector<std::string>& args, const fs::path& errfile) {
  std::string cmd = quote(ckpt_bin());
  for (const auto& a : args) cmd += " " + quote(a);
  cmd += " >/dev/null 2>" + quote(errfile.string());
  int st = std::system(cmd.c_str());
  CmdResult r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  r.err = slurp(errfile);
  return r;
}

const char* kConfig = R"({"architectures":["LlamaForCausalLM"],"model_type":"llama","vocab_size":4,"hidden_size":2,
"intermediate_size":4,"num_hidden_layers":1,"num_attention_heads":1,"torch_dtype":"float32"})";

class CliBadFiles : public ckpt::testing::TempDirTest {
 protected:

  // A fresh HF directory holding config.json and `model.safetensors` = bytes.
  fs::path hf_dir(const std::string& name, const std::string& bytes) {
    fs::path d = root_ / name;
    fs::create_directories(d);
    write(d / "config.json", kConfig);
    write(d / "model.safetensors", bytes);
    return d;
  }

  // Runs `from-hf DIR`, `to-hf FILE` and `inspect FILE` and checks each fails with `exit_code`
  // naming `rule` and the file, without sanitizer reports or leftovers.
  void expect_refused(const std::string& name, const fs::path& dir, const fs::path& bad_file, const std::string& rule,
                      int exit_code) {
    const fs::path err = root_ / (name + ".err");
    const std::vector<std::vector<std::string>> cmds = {
        {"from-hf", dir.string(), (root_ / (name + "_native")).string(), "--no-fsync"},
        {"to-hf", bad_file.string(), (root_ / (name + "_hf")).string(), "--no-fsync"},
        {"inspect", bad_file.string()},
        {"verify", bad_file.string()},
    };
    for (const auto& c : cmds) {
      SCOPED_TRACE(name + ": ckpt " + c[0] + " " + c[1]);
      CmdResult r = ckpt(c, err);
      EXPECT_EQ(r.code, exit_code) << r.err;
      EXPECT_NE(r.err.find(rule), std::string::npos) << "stderr does not name rule " << rule << ":\n" << r.err;
      EXPECT_NE(r.err.find(bad_file.filename().string()), std::string::npos) << "stderr does not name the file:\n" << r.err;
      EXPECT_EQ(r.err.find("Sanitizer"), std::string::npos) << r.err;
      EXPECT_EQ(r.err.find("runtime error"), std::string::npos) << r.err;
      if (c.size() > 2) {
        EXPECT_FALSE(fs::exists(c[2])) << c[2];
        EXPECT_FALSE(fs::exists(c[2] + ".partial")) << c[2];
      }
    }
  }
};

struct BadCase {
  const char* name;
  std::string bytes;
  const char* rule;
};

std::vector<BadCase> bad_files() {
  const std::string ok_t = t("a", "F32", "[2]", 0, 8);
  return {
      {"too_small", std::string("\x01\x02\x03", 3), "HeaderTooSmall"},
      {"empty_file", "", "HeaderTooSmall"},
      {"huge_header_length", le64(1ull << 40) + "{}", "HeaderTooLarge"},
      {"header_length_max_u64", le64(UINT64_MAX) + "{}", "HeaderTooLarge"},
      {"header_past_end", le64(64) + "{}", "InvalidHeaderLength"},
      {"not_utf8", file_of("{\"\xff\xfe\":{}}", ""), "InvalidHeader"},
      {"utf8_surrogate", file_of("{\"\xed\xa0\x80\":1}", ""), "InvalidHeader"},
      {"invalid_json", file_of("{\"a\":", ""), "InvalidHeaderDeserialization"},
      {"not_an_object", file_of("[1,2]", ""), "InvalidHeaderDeserialization"},
      {"nul_padding_after_json", file_of("{}" + std::string(6, '\0'), ""), "InvalidHeaderDeserialization"},
      {"second_object_after_json", file_of("{}{}", ""), "InvalidHeaderDeserialization"},
      {"bom", file_of("\xef\xbb\xbf{}", ""), "InvalidHeaderDeserialization"},
      {"unknown_dtype", file_of("{" + t("a", "F31", "[2]", 0, 8) + "}", std::string(8, '\0')), "InvalidHeaderDeserialization"},
      {"lowercase_dtype", file_of("{" + t("a", "f32", "[2]", 0, 8) + "}", std::string(8, '\0')), "InvalidHeaderDeserialization"},
      {"missing_field", file_of("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", std::string(8, '\0')), "InvalidHeaderDeserialization"},
      {"negative_dim", file_of("{" + t("a", "F32", "[-2]", 0, 8) + "}", std::string(8, '\0')), "InvalidHeaderDeserialization"},
      {"metadata_not_strings", file_of("{\"__metadata__\":{\"k\":1}," + ok_t + "}", std::string(8, '\0')),
       "InvalidHeaderDeserialization"},
      {"gap", file_of("{" + t("a", "F32", "[2]", 4, 12) + "}", std::string(12, '\0')), "InvalidOffset"},
      {"gap_between", file_of("{" + ok_t + "," + t("b", "U8", "[2]", 10, 12) + "}", std::string(12, '\0')), "InvalidOffset"},
      {"overlap", file_of("{" + ok_t + "," + t("b", "F32", "[2]", 4, 12) + "}", std::string(12, '\0')), "InvalidOffset"},
      {"end_before_begin", file_of("{" + t("a", "U8", "[0]", 0, 0) + "," + t("b", "U8", "[2]", 0, 2) + "," +
                                       t("c", "U8", "[0]", 4, 2) + "}",
                                   std::string(2, '\0')),
       "InvalidOffset"},
      {"offsets_past_end", file_of("{" + t("a", "F32", "[4]", 0, 16) + "}", std::string(8, '\0')), "MetadataIncompleteBuffer"},
      {"size_overflow", file_of("{" + t("a", "F32", "[4611686018427387904,4]", 0, 0) + "}", ""), "ValidationOverflow"},
      {"numel_overflow", file_of("{" + t("a", "U8", "[4294967296,4294967296,2]", 0, 0) + "}", ""), "ValidationOverflow"},
      {"byte_length_mismatch", file_of("{" + t("a", "F32", "[2]", 0, 4) + "}", std::string(4, '\0')), "TensorInvalidInfo"},
      {"missing_data_bytes", file_of("{" + ok_t + "}", std::string(5, '\0')), "MetadataIncompleteBuffer"},
      {"trailing_data_bytes", file_of("{" + ok_t + "}", std::string(9, '\0')), "MetadataIncompleteBuffer"},
      // Stricter than the reference.
      {"duplicate_tensor", file_of("{" + t("a", "U8", "[1]", 0, 1) + "," + t("a", "U8", "[1]", 1, 2) + "}", std::string(2, '\0')),
       "DuplicateKey"},
      {"unknown_field", file_of("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":1}}", std::string(1, '\0')),
       "UnknownTensorField"},
      {"empty_name", file_of("{" + t("", "U8", "[1]", 0, 1) + "}", std::string(1, '\0')), "InvalidTensorName"},
  };
}

TEST_F(CliBadFiles, EveryHeaderRuleGivesExit3NamingTheRule) {
  for (const auto& c : bad_files()) {
    fs::path d = hf_dir(c.name, c.bytes);
    expect_refused(c.name, d, d / "model.safetensors", c.rule, 3);
  }
}

TEST_F(CliBadFiles, HarnessAcceptsAValidFile) {
  // The same harness on a valid tiny LLaMA (vocab 4, hidden 2, inter 4, 1 layer, untied).
  std::string hdr = "{", data;
  uint64_t off = 0;
  auto add = [&](const std::string& n, const std::string& shape, uint64_t numel) {
    hdr += (hdr.size() > 1 ? "," : "") + t(n, "F32", shape, off, off + 4 * numel);
    off += 4 * numel;
  };
  add("lm_head.weight", "[4,2]", 8);
  add("model.embed_tokens.weight", "[4,2]", 8);
  add("model.layers.0.input_layernorm.weight", "[2]", 2);
  add("model.layers.0.mlp.down_proj.weight", "[2,4]", 8);
  add("model.layers.0.mlp.gate_proj.weight", "[4,2]", 8);
  add("model.layers.0.mlp.up_proj.weight", "[4,2]", 8);
  add("model.layers.0.post_attention_layernorm.weight", "[2]", 2);
  add("model.layers.0.self_attn.k_proj.weight", "[2,2]", 4);
  add("model.layers.0.self_attn.o_proj.weight", "[2,2]", 4);
  add("model.layers.0.self_attn.q_proj.weight", "[2,2]", 4);
  add("model.layers.0.self_attn.v_proj.weight", "[2,2]", 4);
  add("model.norm.weight", "[2]", 2);
  hdr += "}";
  fs::path d = hf_dir("valid", file_of(hdr, std::string(off, '\x01')));
  const fs::path err = root_ / "valid.err";
  CmdResult r = ckpt({"from-hf", d.string(), (root_ / "n").string(), "--no-fsync"}, err);
  EXPECT_EQ(r.code, 0) << r.err;
  r = ckpt({"from-hf", d.string(), (root_ / "n2").string(), "--tp", "1", "--pp", "1", "--dp", "2", "--zero", "1", "--no-fsync"}, err);
  ASSERT_EQ(r.code, 0) << r.err;
  r = ckpt({"to-hf", (root_ / "n2").string(), (root_ / "back").string(), "--no-fsync"}, err);
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string back = slurp(root_ / "back" / "model.safetensors");
  ASSERT_GE(back.size(), off);
  EXPECT_EQ(back.substr(back.size() - off), std::string(off, '\x01'));
  r = ckpt({"inspect", (d / "model.safetensors").string()}, err);
  EXPECT_EQ(r.code, 0) << r.err;
}

TEST_F(CliBadFiles, IndexRulesGiveClearErrors) {
  struct IndexCase {
    const char* name;
    std::string index;
    const char* rule;
    int exit_code;
  };
  const std::string shard = "model-00001-of-00001.safetensors";
  auto idx = [&](const std::string& b_file) {
    return "{\"metadata\":{\"total_size\":2},\"weight_map\":{\"a\":\"" + shard + "\",\"b\":\"" + b_file + "\"}}";
  };
  const std::vector<IndexCase> cases = {
      {"parent_dir", idx("../evil.safetensors"), "IndexBadFileName", 3},
      {"absolute", idx("/tmp/evil.safetensors"), "IndexBadFileName", 3},
      {"sub_dir", idx("sub/evil.safetensors"), "IndexBadFileName", 3},
      {"dot_dot", idx(".."), "IndexBadFileName", 3},
      {"backslash", idx("..\\\\evil.safetensors"), "IndexBadFileName", 3},
      {"not_safetensors", idx("evil.bin"), "IndexBadFileName", 3},
      {"missing_file", idx("model-00002-of-00002.safetensors"), "IndexMissingFile", 4},
      {"mismatch", "{\"weight_map\":{\"a\":\"" + shard + "\",\"b\":\"" + shard + "\"}}", "IndexMismatch", 3},
      {"empty_weight_map", "{\"weight_map\":{}}", "IndexInvalid", 3},
      {"invalid_json", "{\"weight_map\":", "InvalidJson", 3},
      {"weight_map_not_object", "{\"weight_map\":[]}", "IndexInvalid", 3},
      {"duplicate_key", "{\"weight_map\":{\"a\":\"" + shard + "\",\"a\":\"" + shard + "\"}}", "DuplicateKey", 3},
  };
  for (const auto& c : cases) {
    fs::path d = root_ / c.name;
    fs::create_directories(d / "sub");
    write(d / "config.json", kConfig);
    write(d / shard, file_of("{" + t("a", "U8", "[2]", 0, 2) + "}", "xy"));
    write(root_ / "evil.safetensors", file_of("{" + t("b", "U8", "[2]", 0, 2) + "}", "zz"));
    write(d / "sub" / "evil.safetensors", file_of("{" + t("b", "U8", "[2]", 0, 2) + "}", "zz"));
    write(d / "model.safetensors.index.json", c.index);
    const fs::path err = root_ / (std::string(c.name) + ".err");
    for (const auto& cmd : std::vector<std::vector<std::string>>{
             {"from-hf", d.string(), (root_ / (std::string(c.name) + "_n")).string(), "--no-fsync"},
             {"to-hf", d.string(), (root_ / (std::string(c.name) + "_hf")).string(), "--no-fsync"},
             {"inspect", d.string()},
             {"verify", d.string()}}) {
      SCOPED_TRACE(std::string(c.name) + ": ckpt " + cmd[0]);
      CmdResult r = ckpt(cmd, err);
      EXPECT_EQ(r.code, c.exit_code) << r.err;
      EXPECT_NE(r.err.find(c.rule), std::string::npos) << r.err;
      EXPECT_EQ(r.err.find("Sanitizer"), std::string::npos) << r.err;
      if (cmd.size() > 2) {
        EXPECT_FALSE(fs::exists(cmd[2])) << cmd[2];
      }
    }
  }
}

}  // namespace
