// ckpt export-megatron SRC DST --tp N --pp N [--pp-layers a,b,..]: Megatron-LM per-rank
// safetensors files (converters/megatron_export.h) from any checkpoint in global view.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/progress.h"
#include "converters/megatron_dist_export.h"
#include "converters/megatron_export.h"
#include "converters/open_checkpoint.h"

namespace ckpt::cli {
namespace {

struct ExportArgs {
  std::string src, dst;
  int tp = 1, pp = 1;
  std::vector<int> pp_layers;
  int64_t vocab_divisor = 128;
  std::string dtype;
  bool local_norms = false;
  std::string format = "safetensors";
};

int run_export(const ExportArgs& a) {
  MegatronExportOptions o;
  o.tp = a.tp;
  o.pp = a.pp;
  o.layers_per_stage = a.pp_layers;
  o.vocab_divisor = a.vocab_divisor;
  o.norms = a.local_norms ? MegatronNormNames::kLocal : MegatronNormNames::kTransformerEngine;
  if (!a.dtype.empty()) {
    auto dt = dtype_from_name(a.dtype, /*cli_aliases=*/true);
    if (!dt.ok()) return report_error(Status::InvalidArgument("--dtype '" + a.dtype + "': expected bf16, fp16 or fp32"));
    o.dtype = *dt;
  }
  auto src = open_checkpoint(a.src);
  if (!src.ok()) return report_error(src.status());
  ProgressBar bar("export-megatron", stderr_is_tty());
  o.progress = bar.callback();
  Status s = a.format == "torch_dist" ? export_megatron_dist(**src, a.dst, o) : export_megatron(**src, a.dst, o);
  bar.finish();
  if (!s.ok()) return report_error(s);
  std::printf("wrote %s (%s, tp=%d pp=%d)\n", a.dst.c_str(), a.format.c_str(), a.tp, a.pp);
  return 0;
}

CommandAction setup_export_megatron(CLI::App& sub) {
  auto a = std::make_shared<ExportArgs>();
  sub.add_option("SRC", a->src, "Source checkpoint: native store dir, HF dir, .safetensors file or DCP dir with HF names (with config)")
      ->required();
  sub.add_option("DST", a->dst, "Output directory (must not exist; written as DST.partial then renamed)")->required();
  sub.add_option("--tp", a->tp, "Tensor-parallel size")->check(CLI::Range(1, 1 << 16));
  sub.add_option("--pp", a->pp, "Pipeline-parallel size")->check(CLI::Range(1, 1 << 16));
  sub.add_option("--pp-layers", a->pp_layers, "Layers per pipeline stage, e.g. 1,2,3 (default: even split)")
      ->delimiter(',');
  sub.add_option("--vocab-divisor", a->vocab_divisor, "make-vocab-size-divisible-by (default 128)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  sub.add_option("--dtype", a->dtype, "Output dtype (bf16, fp16, fp32); default: the source's");
  sub.add_flag("--local-norms", a->local_norms,
               "Local-spec norm names (input_layernorm / pre_mlp_layernorm) instead of Transformer Engine's");
  sub.add_option("--format", a->format,
                 "Output format: safetensors (per-rank dirs, default) or torch_dist (Megatron-Core dist_checkpointing dir)")
      ->check(CLI::IsMember({"safetensors", "torch_dist"}));
  return [a] { return run_export(*a); };
}

}  // namespace

CKPT_REGISTER_COMMAND("export-megatron", "Write Megatron-LM per-rank (TP/PP) safetensors from a checkpoint", setup_export_megatron);

}  // namespace ckpt::cli
