// `ckpt inspect PATH [--json]`: layout summary, tensors (dtype, global shape, pieces, bytes),
// totals and compression ratio of a checkpoint. Parses and prints; the work is in formats/.
#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "formats/store/store_reader.h"
#include "formats/store/summary.h"

namespace ckpt::cli {
namespace {

store::SourceExtras store_extras(store::StoreReader& r) {
  store::SourceExtras ex;
  ex.format = std::string(store::kFormatName) + " v" + std::to_string(store::kFormatVersion);
  ex.stored_bytes = [&r](size_t i) { return r.stored_bytes(i); };
  ex.codec = [&r](size_t i) {
    const auto& p = r.manifest().pieces[i];
    std::string c = store::codec_name(p.codec);
    if (p.codec != store::Codec::kNone) c += "-" + std::to_string(p.codec_level);
    return c;
  };
  ex.file = [&r](size_t i) { return r.manifest().pieces[i].file; };
  return ex;
}

CKPT_REGISTER_COMMAND("inspect", "Summarize a checkpoint: layout, tensors, pieces, sizes, compression", [](CLI::App& sub) {
  auto path = std::make_shared<std::string>();
  auto json_out = std::make_shared<bool>(false);
  sub.add_option("path", *path, "Checkpoint directory or run directory (follows 'latest')")->required();
  sub.add_flag("--json", *json_out, "Print the summary as JSON");
  return CommandAction([path, json_out]() -> int {
    auto r = store::StoreReader::open(*path);
    if (!r.ok()) return report_error(r.status());
    auto ex = store_extras(**r);
    auto s = store::summarize_source(**r, &ex);
    if (*json_out) std::printf("%s\n", s.dump(2).c_str());
    else std::fputs(store::text_summary(s).c_str(), stdout);
    return 0;
  });
});

}  // namespace
}  // namespace ckpt::cli
