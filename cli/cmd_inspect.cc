// `ckpt inspect PATH [--json]`: layout summary, tensors (dtype, global shape, pieces, bytes),
// totals and compression ratio of a checkpoint of any kind ckpt reads; a layout is also described
// stage by stage ("layout_detail"). The work is converters/jobs/inspect_job.h (run_inspect_job;
// also python's ckpt.inspect); this file parses the flags and prints.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "converters/jobs/inspect_job.h"

namespace ckpt::cli {
namespace {

CKPT_REGISTER_COMMAND("inspect", "Summarize a checkpoint: layout, tensors, pieces, sizes, compression", [](CLI::App& sub) {
  auto path = std::make_shared<std::string>();
  auto json_out = std::make_shared<bool>(false);
  sub.add_option("path", *path,
                 "Native checkpoint or run directory (follows 'latest'), a .safetensors file, a HuggingFace directory, a Megatron-layout "
                 "directory (export-megatron), a Megatron-LM legacy or Megatron-Core torch_dist directory, a PyTorch Distributed Checkpoint "
                 "directory (.metadata) or a DeepSpeed ZeRO 1/2/3 directory ('latest' + global_stepN/, or the step dir)")
      ->required();
  sub.add_flag("--json", *json_out, "Print the summary as JSON");
  auto profile = std::make_shared<std::string>();
  add_source_profile_flag(sub, *profile);
  return CommandAction([path, json_out, profile]() -> int {
    auto r = run_inspect_job(InspectRequest{*path, *profile});
    if (!r.ok()) return report_error(r.status());
    if (*json_out) std::printf("%s\n", r->to_json().dump(2).c_str());
    else std::fputs(r->to_text().c_str(), stdout);
    return 0;
  });
});

}  // namespace
}  // namespace ckpt::cli
