// ckpt from-hf HF_DIR OUT: imports a HuggingFace LLaMA directory (single-file or sharded
// safetensors + config.json) into a native store checkpoint.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "converters/hf_import.h"
#include "formats/open_source.h"
#include "formats/store/store_writer.h"

namespace ckpt::cli {
namespace {

CommandAction setup_from_hf(CLI::App& sub) {
  struct Opts {
    std::string src, out, dtype, codec = "none";
    int threads = 2;
    bool no_fsync = false;
  };
  auto o = std::make_shared<Opts>();
  sub.add_option("HF_DIR", o->src, "HuggingFace directory (model.safetensors[.index.json] + config.json)")->required();
  sub.add_option("OUT", o->out, "native checkpoint directory to create (must not exist)")->required();
  sub.add_option("--dtype", o->dtype, "cast float weights to bf16|fp16|fp32 (default: keep)");
  sub.add_option("--codec", o->codec, "shard compression: none, zstd, shuffle+zstd (default none)");
  sub.add_option("--threads", o->threads, "worker threads for casts and copies (default 2)")->check(CLI::Range(1, 64));
  sub.add_flag("--no-fsync", o->no_fsync, "skip fsync (tests, benchmarks)");
  return [o]() -> int {
    HfImportOptions opts;
    opts.threads = o->threads;
    if (!o->dtype.empty()) {
      auto dt = dtype_from_name(o->dtype, /*cli_aliases=*/true);
      if (!dt.ok() || !dtype_is_float(*dt)) return report_error(Status::InvalidArgument("--dtype '" + o->dtype + "': expected bf16, fp16 or fp32"));
      opts.dtype = *dt;
    }
    store::StoreOptions so;
    so.fsync = !o->no_fsync;
    auto codec = store::codec_from_name(o->codec);
    if (!codec.ok()) return report_error(Status::InvalidArgument("--codec: " + codec.status().message()));
    so.codec = *codec;
    auto kind = detect_source(o->src);
    if (kind != SourceKind::kHfDir && kind != SourceKind::kSafetensorsFile)
      return report_error(Status::InvalidArgument("'" + o->src + "' is not a HuggingFace directory (no model.safetensors[.index.json])"));
    auto src = open_source(o->src);
    if (!src.ok()) return report_error(src.status());
    auto plan = plan_hf_import(**src, opts);
    if (!plan.ok()) return report_error(plan.take_status().with_file(o->src));
    store::StoreWriter sink(o->out, so);
    Status st = run_hf_import(**src, sink, *plan, opts);
    if (!st.ok()) return report_error(st);
    std::printf("imported %zu tensors (%llu bytes) into %s", plan->tensors.size(), static_cast<unsigned long long>(plan->total_bytes),
                o->out.c_str());
    if (!plan->skipped.empty()) std::printf("; skipped %zu (inv_freq / tied lm_head)", plan->skipped.size());
    std::printf("\n");
    return 0;
  };
}

CKPT_REGISTER_COMMAND("from-hf", "Import a HuggingFace LLaMA safetensors directory into a native checkpoint", setup_from_hf);

}  // namespace
}  // namespace ckpt::cli
