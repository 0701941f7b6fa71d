// `ckpt verify PATH [--json]`: any checkpoint ckpt reads, checked by what its format offers
// (converters/jobs/verify_job.h): a native store's structure and every piece digest (xxh3-128 or
// sha256, as each piece records) and its manifest checksum; torch zip entries' CRC-32; a format
// without checksums (safetensors) validated structurally and every byte read back, which the
// output says by format name. Exit 0 only if everything holds; each failure names file, dataset or
// tensor and what differs. Draws a progress line on a terminal. The work is
// converters/jobs/verify_job.h (also python's ckpt.verify).
#include <cstdio>
#include <memory>
#include <set>
#include <string>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/progress.h"
#include "converters/jobs/verify_job.h"
#include "formats/base/byte_size.h"

namespace ckpt::cli {
namespace {

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
                 "directory (export-megatron), a Megatron-LM legacy or Megatron-Core torch_dist directory, a PyTorch Distributed Checkpoint "
                 "directory (.metadata) or a DeepSpeed ZeRO 1/2/3 directory ('latest' + global_stepN/, or the step dir)")
      ->required();
  sub.add_flag("--json", *json_out, "Print the result as JSON");
  auto threads = std::make_shared<int>(2);
  sub.add_option("--threads", *threads, "pieces hashed at a time (native checkpoints; default 2)")->check(CLI::Range(1, 64));
  auto profile = std::make_shared<std::string>();
  add_source_profile_flag(sub, *profile);
  return CommandAction([path, json_out, threads, profile]() -> int {
    ProgressBar bar("verify", stderr_is_tty() && !*json_out);
    auto r = verify_checkpoint(*path, *threads, bar.callback(), *profile);
    bar.finish();
    if (!r.ok()) return open_failure(*path, r.status(), *json_out);
    if (*json_out) {
      std::printf("%s\n", r->to_json().dump(2).c_str());
    } else {
      for (const auto& f : r->failures) std::fprintf(stderr, "ckpt: %s\n", f.status.to_string().c_str());
      std::printf("%s: %s (%s): %llu pieces, %s %s in %.2f s, %zu failures\n", r->ok() ? "OK" : "FAILED", r->path.c_str(),
                  r->format.c_str(), static_cast<unsigned long long>(r->pieces), human_bytes(r->bytes).c_str(),
                  r->checksums ? ("checked (" + (r->digests.empty() ? r->scheme : joined(r->digests)) + ")").c_str() : "read",
                  r->seconds, r->failures.size());
      if (!r->cannot_check.empty()) std::printf("note: %s\n", r->cannot_check.c_str());
    }
    if (r->ok()) return 0;
    return exit_code_for(r->failures.front().status) == 3 ? 3 : 1;
  });
});

}  // namespace
}  // namespace ckpt::cli
