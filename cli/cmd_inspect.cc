// `ckpt inspect PATH [--json]`: layout summary, tensors (dtype, global shape, pieces, bytes),
// totals and compression ratio of a checkpoint: a native store (checkpoint or run directory), a
// .safetensors file, or a HuggingFace directory (index + shards, or one model.safetensors).
// A layout (either form, reshard/layout/layout.h) is also described as "layout_detail": its pipelines,
// each stage's layers, tp, device type and world ranks. Parses and prints; the work is in formats/.
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "converters/jobs/open_checkpoint.h"
#include "formats/store/summary.h"
#include "reshard/layout/layout.h"

namespace ckpt::cli {
namespace {

// {"form", "world_size", "zero", "uniform_pipelines", "pipelines": [{"pipeline", "micro_batch",
//  "stages": [{"stage", "layers": [first, last], "tp", "device", "ranks": [...]}]}]}, or null
// when `lj` is not a valid layout.
nlohmann::json layout_detail(const nlohmann::json& lj) {
  if (!lj.is_object()) return nullptr;
  auto l = Layout::from_json(lj);
  if (!l.ok()) return nullptr;
  nlohmann::json pls = nlohmann::json::array();
  for (int p = 0; p < l->num_pipelines(); ++p) {
    nlohmann::json stages = nlohmann::json::array();
    for (int s = 0; s < l->num_stages(p); ++s) {
      std::vector<int> ranks;
      for (int t = 0; t < l->stage_tp(p, s); ++t) ranks.push_back(l->rank_of(s, p, t));
      const int first = l->stage_first_layer(p, s);
      stages.push_back({{"stage", s},
                        {"layers", {first, first + l->stage_layers(p, s) - 1}},
                        {"tp", l->stage_tp(p, s)},
                        {"device", l->stage_device(p, s)},
                        {"ranks", ranks}});
    }
    pls.push_back({{"pipeline", p}, {"micro_batch", l->pipeline_micro_batch(p)}, {"stages", stages}});
  }
  return {{"form", l->symmetric() ? "symmetric" : "general"},
          {"world_size", l->world_size()},
          {"zero", l->zero},
          {"uniform_pipelines", l->uniform_pipelines()},
          {"pipelines", pls}};
}

CKPT_REGISTER_COMMAND("inspect", "Summarize a checkpoint: layout, tensors, pieces, sizes, compression", [](CLI::App& sub) {
  auto path = std::make_shared<std::string>();
  auto json_out = std::make_shared<bool>(false);
  sub.add_option("path", *path,
                 "Native checkpoint or run directory (follows 'latest'), a .safetensors file, a HuggingFace directory, a Megatron-layout "
                 "directory (export-megatron) or a PyTorch Distributed Checkpoint directory (.metadata)")
      ->required();
  sub.add_flag("--json", *json_out, "Print the summary as JSON");
  return CommandAction([path, json_out]() -> int {
    // A native store as stored (its profile's tensors), not its canonical view.
    auto src = open_checkpoint_as_stored(*path);
    if (!src.ok()) return report_error(src.status());
    const IntegrityInfo integrity = (*src)->integrity();  // its format's name, and what `ckpt verify` can check
    const CheckpointKind* k = detect_checkpoint(*path);
    const store::SourceExtras ex = store::extras_of(**src, !integrity.format.empty() ? integrity.format : k ? k->name : "");
    auto s = store::summarize_source(**src, &ex);
    s["layout_detail"] = layout_detail(s["layout"]);
    s["integrity"] = {{"scheme", integrity.scheme}, {"note", integrity.cannot_check}};
    if (*json_out) std::printf("%s\n", s.dump(2).c_str());
    else std::fputs(store::text_summary(s).c_str(), stdout);
    return 0;
  });
});

}  // namespace
}  // namespace ckpt::cli
