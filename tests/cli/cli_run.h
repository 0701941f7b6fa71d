// Runs the ckpt binary of this build (CKPT_BIN, or $CKPT_BIN when set, e.g. the sanitized binary)
// for the CLI tests: exit code (128 + signal when killed) and stderr.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace ckpt::testing {

struct CmdResult {
  int code = -1;
  std::string err;
};

inline std::string ckpt_bin() {
  const char* env = std::getenv("CKPT_BIN");
  return env && *env ? env : CKPT_BIN;
}

// `ckpt ARGS... >/dev/null 2>errfile`.
inline CmdResult run_ckpt(const std::vector<std::string>& args, const std::filesystem::path& errfile) {
  std::string cmd = "'" + ckpt_bin() + "'";
  for (const auto& a : args) cmd += " '" + a + "'";
  cmd += " >/dev/null 2>'" + errfile.string() + "'";
  const int st = std::system(cmd.c_str());
  CmdResult r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  std::ifstream f(errfile);
  std::stringstream ss;
  ss << f.rdbuf();
  r.err = ss.str();
  return r;
}

// A tiny trained LLaMA checkpoint under `root`: `ckpt train` on fixtures/tiny_llama.json for one
// step; returns the checkpoint dir (empty and `*err` set on failure).
inline std::filesystem::path train_tiny(const std::filesystem::path& root, std::string* err) {
  CmdResult r = run_ckpt({"train", "--config", std::string(CKPT_SOURCE_DIR) + "/fixtures/tiny_llama.json", "--steps", "1",
                          "--micro-batch", "1", "--seq-len", "8", "--out", (root / "run").string(), "--sync-save"},
                         root / "train.err");
  if (r.code != 0) {
    *err = r.err;
    return {};
  }
  std::ifstream latest(root / "run" / "latest");
  std::string step;
  latest >> step;
  return root / "run" / step;
}

}  // namespace ckpt::testing
