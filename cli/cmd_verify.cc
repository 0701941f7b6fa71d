// `ckpt verify PATH [--json]`: a native store: checks its structure (manifest rules, shard files
// and datasets) and recomputes every piece's digest (xxh3-128 or sha256, as each piece records).
// A .safetensors file or a HuggingFace directory: full structural validation (header, offsets,
// index against shards) and every byte of every tensor read back; safetensors has no checksums,
// which the output says. Exit 0 only if everything holds; each failure names file, dataset or
// tensor and what differs. Draws a progress line on a terminal.
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <set>
#include <string>

#include "cli/commands.h"
#include "cli/progress.h"
#include "formats/byte_size.h"
#include "converters/open_checkpoint.h"
#include "formats/open_source.h"
#include "formats/store/source_scan.h"
#include "formats/store/store_reader.h"
#include "formats/store/summary.h"

namespace ckpt::cli {
namespace {

constexpr const char* kNoChecksumNote =
    "safetensors has no checksums: structure validated and every byte read, content integrity not checkable";

// The digest algorithms of a store's pieces, sorted, e.g. {"sha256", "xxh3-128"}.
std::set<std::string> digest_names(const store::Manifest& m) {
  std::set<std::string> names;
  for (const auto& p : m.pieces) names.insert(digest_algo_name(p.digest.algo));
  return names;
}
std::string joined(const std::set<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s.empty() ? "no pieces" : s;
}

int open_failure(const std::string& path, const Status& st, bool json_out) {
  if (!json_out) return report_error(st);
  nlohmann::json j = {{"path", path}, {"ok", false}, {"structure_ok", false},
                      {"failures", {{{"code", st.code()}, {"file", st.file()}, {"tensor", st.tensor()}, {"message", st.to_string()}}}}};
  std::printf("%s\n", j.dump(2).c_str());
  return exit_code_for(st);
}

CKPT_REGISTER_COMMAND("verify", "Check a checkpoint's structure and every checksum (safetensors: structure + read every byte)", [](CLI::App& sub) {
  auto path = std::make_shared<std::string>();
  auto json_out = std::make_shared<bool>(false);
  sub.add_option("path", *path,
                 "Native checkpoint or run directory (follows 'latest'), a .safetensors file, a HuggingFace directory, a Megatron-layout "
                 "directory (export-megatron) or a PyTorch Distributed Checkpoint directory (.metadata)")
      ->required();
  sub.add_flag("--json", *json_out, "Print the result as JSON");
  auto threads = std::make_shared<int>(2);
  sub.add_option("--threads", *threads, "pieces hashed at a time (native checkpoints; default 2)")->check(CLI::Range(1, 64));
  return CommandAction([path, json_out, threads]() -> int {
    const SourceKind kind = detect_source(*path);
    auto src = open_checkpoint(*path);
    if (!src.ok()) return open_failure(*path, src.status(), *json_out);
    auto* store_reader = dynamic_cast<store::StoreReader*>(src->get());
    ProgressBar bar("verify", stderr_is_tty() && !*json_out);
    auto t0 = std::chrono::steady_clock::now();
    store::VerifyReport rep = store_reader ? store_reader->verify(bar.callback(), *threads) : store::scan_source(**src, bar.callback());
    bar.finish();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string format = store_reader ? std::string(store::kFormatName) + " v" + std::to_string(store_reader->manifest().version)
                               : kind == SourceKind::kHfDir             ? "huggingface safetensors directory"
                               : kind == SourceKind::kSafetensorsFile   ? "safetensors"
                                                                        : detect_checkpoint(*path)->name;
    const std::string where = store_reader ? store_reader->dir() : (*src)->describe();
    if (*json_out) {
      nlohmann::json fails = nlohmann::json::array();
      for (const auto& f : rep.failures) {
        nlohmann::json fj = {{"code", f.status.code()}, {"piece", f.piece}, {"tensor", (*src)->pieces()[f.piece].tensor},
                             {"file", f.status.file()}, {"message", f.status.to_string()}};
        if (store_reader) {
          const auto& p = store_reader->manifest().pieces[f.piece];
          fj["file"] = p.file;
          fj["dataset"] = p.dataset;
        }
        fails.push_back(std::move(fj));
      }
      nlohmann::json j = {{"path", where}, {"format", format}, {"ok", rep.ok()}, {"structure_ok", true},
                          {"checksums", store_reader != nullptr}, {"pieces", rep.pieces}, {"bytes", rep.bytes},
                          {"seconds", secs}, {"failures", fails}};
      if (store_reader) j["digests"] = digest_names(store_reader->manifest());
      if (!store_reader) j["note"] = kNoChecksumNote;
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      for (const auto& f : rep.failures) std::fprintf(stderr, "ckpt: %s\n", f.status.to_string().c_str());
      std::printf("%s: %s (%s): %llu pieces, %s %s in %.2f s, %zu failures\n", rep.ok() ? "OK" : "FAILED", where.c_str(), format.c_str(),
                  static_cast<unsigned long long>(rep.pieces), human_bytes(rep.bytes).c_str(),
                  store_reader ? ("checked (" + joined(digest_names(store_reader->manifest())) + ")").c_str() : "read", secs, rep.failures.size());
      if (!store_reader) std::printf("note: %s\n", kNoChecksumNote);
    }
    if (rep.ok()) return 0;
    return exit_code_for(rep.failures.front().status) == 3 ? 3 : 1;
  });
});

}  // namespace
}  // namespace ckpt::cli
