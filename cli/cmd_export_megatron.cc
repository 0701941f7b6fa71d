// ckpt export-megatron SRC DST --tp N --pp N [--pp-layers a,b,..] [--format F]: Megatron-LM per-rank
// safetensors or torch files (converters/megatron/megatron_export.h), or a Megatron-Core torch_dist
// directory (converters/megatron/dist/megatron_dist_export.h), from any checkpoint in global view.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/progress.h"
#include "converters/jobs/open_checkpoint.h"
#include "converters/jobs/source_check_job.h"
#include "converters/megatron/dist/megatron_dist_export.h"
#include "converters/megatron/megatron_export.h"

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
  int64_t iteration = 0;
  bool no_verify = false;
};

int run_export(const ExportArgs& a) {
  MegatronExportOptions o;
  o.tp = a.tp;
  o.pp = a.pp;
  o.layers_per_stage = a.pp_layers;
  o.vocab_divisor = a.vocab_divisor;
  o.format = a.format == "torch" ? MegatronFileFormat::kTorch : MegatronFileFormat::kSafetensors;
  o.iteration = a.iteration;
  o.norms = a.local_norms ? MegatronNormNames::kLocal : MegatronNormNames::kTransformerEngine;
  if (!a.dtype.empty()) {
    auto dt = dtype_from_name(a.dtype, /*cli_aliases=*/true);
    if (!dt.ok()) return report_error(Status::InvalidArgument("--dtype '" + a.dtype + "': expected bf16, fp16 or fp32"));
    o.dtype = *dt;
  }
  JobSourceCheck check;  // forked before this process opens SRC
  check.start(a.src, IoMode::kBuffered, 2, a.no_verify);
  auto src = open_checkpoint(a.src);
  if (!src.ok()) return report_error(src.status());
  o.before_commit = check.before_commit(**src);
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
                 "safetensors (default): DST/mp_rank_*/model.safetensors + megatron_args.json, which ckpt reads back; "
                 "torch: Megatron-LM's own legacy layout, DST/latest_checkpointed_iteration.txt + "
                 "DST/iter_NNNNNNN/mp_rank_TT[_PPP]/model_optim_rng.pt (torch.save files with args, "
                 "checkpoint_version 3.0, iteration, model) that Megatron-LM loads with --load DST; "
                 "torch_dist: a Megatron-Core dist_checkpointing directory (PyTorch DCP: __R_K.distcp, .metadata, "
                 "common.pt, metadata.json) that megatron.core.dist_checkpointing.load accepts")
      ->check(CLI::IsMember({"safetensors", "torch", "torch_dist"}));
  sub.add_option("--iteration", a->iteration, "--format torch: the iteration the checkpoint is saved as (default 0)")
      ->check(CLI::Range(int64_t{0}, int64_t{9999999}));
  add_no_verify_flag(sub, a->no_verify);
  return [a] { return run_export(*a); };
}

}  // namespace

CKPT_REGISTER_COMMAND("export-megatron", "Write Megatron-LM checkpoints (per-rank safetensors or torch files, or Megatron-Core torch_dist) from a checkpoint", setup_export_megatron);

}  // namespace ckpt::cli
