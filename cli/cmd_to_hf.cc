// ckpt to-hf SRC OUT: exports a checkpoint's model weights as a HuggingFace directory.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "converters/hf_export.h"
#include "formats/open_source.h"
#include "formats/safetensors/st_index.h"

namespace ckpt::cli {
namespace {

CommandAction setup_to_hf(CLI::App& sub) {
  struct Opts {
    std::string src, out, dtype, max_shard = "5GB";
    int threads = 2;
    bool no_fsync = false;
  };
  auto o = std::make_shared<Opts>();
  sub.add_option("SRC", o->src, "native store dir, HuggingFace dir or .safetensors file")->required();
  sub.add_option("OUT", o->out, "output directory (must not exist, or be empty)")->required();
  sub.add_option("--dtype", o->dtype, "cast float weights to bf16|fp16|fp32 (default: keep)");
  sub.add_option("--max-shard-size", o->max_shard, "largest shard, e.g. 5GB, 500MB, 2GiB (default 5GB)");
  sub.add_option("--threads", o->threads, "worker threads for casts and copies (default 2)")->check(CLI::Range(1, 64));
  sub.add_flag("--no-fsync", o->no_fsync, "skip fsync (tests, benchmarks)");
  return [o]() -> int {
    HfExportOptions opts;
    opts.threads = o->threads;
    opts.fsync = !o->no_fsync;
    if (!o->dtype.empty()) {
      auto dt = dtype_from_name(o->dtype, /*cli_aliases=*/true);
      if (!dt.ok() || !dtype_is_float(*dt)) return report_error(Status::InvalidArgument("--dtype '" + o->dtype + "': expected bf16, fp16 or fp32"));
      opts.dtype = *dt;
    }
    auto ms = safetensors::parse_size(o->max_shard);
    if (!ms.ok()) return report_error(Status::InvalidArgument("--max-shard-size: " + ms.status().message()));
    opts.max_shard_size = *ms;
    auto src = open_source(o->src);
    if (!src.ok()) return report_error(src.status());
    auto plan = plan_hf_export(**src, o->src, opts);
    if (!plan.ok()) return report_error(plan.take_status().with_file(o->src));
    Status st = run_hf_export(**src, *plan, o->out, opts);
    if (!st.ok()) return report_error(st);
    std::printf("wrote %zu tensors (%llu bytes)%s to %s", plan->tensors.size(), static_cast<unsigned long long>(plan->total_bytes),
                plan->config ? " + config.json" : "", o->out.c_str());
    if (!plan->skipped.empty()) std::printf("; left out %zu non-model tensors", plan->skipped.size());
    std::printf("\n");
    return 0;
  };
}

CKPT_REGISTER_COMMAND("to-hf", "Export model weights to a HuggingFace safetensors directory (config.json, index when sharded)",
                      setup_to_hf);

}  // namespace
}  // namespace ckpt::cli
