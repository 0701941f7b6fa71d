// `ckpt inspect PATH [--json]`: layout summary, tensors (dtype, global shape, pieces, bytes),
// totals and compression ratio of a checkpoint: a native store (checkpoint or run directory), a
// .safetensors file, or a HuggingFace directory (index + shards, or one model.safetensors).
// Parses and prints; the work is in formats/.
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "formats/open_source.h"
#include "formats/safetensors/st_dir.h"
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

// safetensors has one piece per tensor, stored raw: the file of each piece is what varies.
store::SourceExtras safetensors_extras(safetensors::HfDirSource& s, bool dir, std::shared_ptr<std::map<std::string, std::string>> file_of) {
  for (const auto& f : s.files()) {
    std::string name = f->path();
    if (auto slash = name.rfind('/'); slash != std::string::npos) name = name.substr(slash + 1);
    for (const auto& t : f->tensors()) (*file_of)[t.name] = name;
  }
  store::SourceExtras ex;
  ex.format = dir ? "huggingface safetensors directory" : "safetensors";
  ex.stored_bytes = [&s](size_t i) {  // stored raw: compression ratio 1
    const Piece& p = s.pieces()[i];
    return static_cast<uint64_t>(p.region.numel()) * dtype_size(p.dtype);
  };
  ex.file = [&s, file_of](size_t i) {
    auto it = file_of->find(s.pieces()[i].tensor);
    return it == file_of->end() ? std::string() : it->second;
  };
  return ex;
}

CKPT_REGISTER_COMMAND("inspect", "Summarize a checkpoint: layout, tensors, pieces, sizes, compression", [](CLI::App& sub) {
  auto path = std::make_shared<std::string>();
  auto json_out = std::make_shared<bool>(false);
  sub.add_option("path", *path,
                 "Native checkpoint or run directory (follows 'latest'), a .safetensors file, or a HuggingFace directory")
      ->required();
  sub.add_flag("--json", *json_out, "Print the summary as JSON");
  return CommandAction([path, json_out]() -> int {
    const SourceKind kind = detect_source(*path);
    auto src = open_source(*path);
    if (!src.ok()) return report_error(src.status());
    store::SourceExtras ex;
    auto file_of = std::make_shared<std::map<std::string, std::string>>();
    if (auto* r = dynamic_cast<store::StoreReader*>(src->get())) ex = store_extras(*r);
    else if (auto* h = dynamic_cast<safetensors::HfDirSource*>(src->get())) ex = safetensors_extras(*h, kind == SourceKind::kHfDir, file_of);
    auto s = store::summarize_source(**src, &ex);
    if (*json_out) std::printf("%s\n", s.dump(2).c_str());
    else std::fputs(store::text_summary(s).c_str(), stdout);
    return 0;
  });
});

}  // namespace
}  // namespace ckpt::cli
