// `ckpt verify PATH [--json]`: checks a checkpoint's structure (manifest rules, shard files and
// datasets) and recomputes every piece's SHA-256. Exit 0 only if everything holds; each failure
// names file, dataset, tensor and what differs. Draws a progress line on a terminal.
#include <chrono>
#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "formats/store/store_reader.h"
#include "formats/store/summary.h"

namespace ckpt::cli {
namespace {

CKPT_REGISTER_COMMAND("verify", "Check a checkpoint's structure and every checksum", [](CLI::App& sub) {
  auto path = std::make_shared<std::string>();
  auto json_out = std::make_shared<bool>(false);
  sub.add_option("path", *path, "Checkpoint directory or run directory (follows 'latest')")->required();
  sub.add_flag("--json", *json_out, "Print the result as JSON");
  return CommandAction([path, json_out]() -> int {
    auto r = store::StoreReader::open(*path);
    if (!r.ok()) {
      if (*json_out) {
        nlohmann::json j = {{"path", *path}, {"ok", false}, {"structure_ok", false},
                            {"failures", {{{"code", r.status().code()}, {"file", r.status().file()},
                                           {"tensor", r.status().tensor()}, {"message", r.status().to_string()}}}}};
        std::printf("%s\n", j.dump(2).c_str());
        return exit_code_for(r.status());
      }
      return report_error(r.status());
    }
    const bool tty = stderr_is_tty() && !*json_out;
    auto t0 = std::chrono::steady_clock::now();
    auto last = t0;
    auto rep = (*r)->verify([&](uint64_t done, uint64_t total) {
      if (!tty) return;
      auto now = std::chrono::steady_clock::now();
      if (now - last < std::chrono::milliseconds(200) && done != total) return;
      last = now;
      std::fprintf(stderr, "\rverify: %s / %s (%.0f%%)", store::human_bytes(done).c_str(), store::human_bytes(total).c_str(),
                   total ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0);
    });
    if (tty) std::fprintf(stderr, "\n");
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const auto& m = (*r)->manifest();
    if (*json_out) {
      nlohmann::json fails = nlohmann::json::array();
      for (const auto& f : rep.failures) {
        const auto& p = m.pieces[f.piece];
        fails.push_back({{"code", f.status.code()}, {"piece", f.piece}, {"tensor", p.piece.tensor}, {"file", p.file},
                         {"dataset", p.dataset}, {"message", f.status.to_string()}});
      }
      nlohmann::json j = {{"path", (*r)->dir()}, {"ok", rep.ok()}, {"structure_ok", true}, {"pieces", rep.pieces},
                          {"bytes", rep.bytes}, {"seconds", secs}, {"failures", fails}};
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      for (const auto& f : rep.failures) std::fprintf(stderr, "ckpt: %s\n", f.status.to_string().c_str());
      std::printf("%s: %s: %llu pieces, %s checked in %.2f s, %zu failures\n", rep.ok() ? "OK" : "FAILED", (*r)->dir().c_str(),
                  static_cast<unsigned long long>(rep.pieces), store::human_bytes(rep.bytes).c_str(), secs, rep.failures.size());
    }
    if (rep.ok()) return 0;
    return exit_code_for(rep.failures.front().status) == 3 ? 3 : 1;
  });
});

}  // namespace
}  // namespace ckpt::cli
