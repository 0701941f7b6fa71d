// ckpt export-megatron SRC DST --tp N --pp N [--pp-layers a,b,..] [--vpp N] [--format F]: Megatron-LM per-rank
// safetensors or torch files, or a Megatron-Core torch_dist directory, from any checkpoint in
// global view. The work is converters/jobs/export_jobs.h (run_export_megatron_job; also python's
// ckpt.export_megatron); this file parses the flags, draws the progress bar and prints the summary.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/progress.h"
#include "converters/jobs/export_jobs.h"

namespace ckpt::cli {
namespace {

struct ExportArgs {
  ExportMegatronRequest req;  // every value but those parsed below
  std::string format = "safetensors", dtype;
  bool json = false;
};

int run_export(const ExportArgs& a) {
  auto parsed = [&]() -> Result<ExportMegatronRequest> {  // the flag text parsed once (errors name the flag)
    ExportMegatronRequest req = a.req;
    CKPT_ASSIGN_OR_RETURN(req.dtype, float_dtype_flag(a.dtype));
    CKPT_ASSIGN_OR_RETURN(req.format, megatron_format_flag(a.format));
    return req;
  }();
  if (!parsed.ok()) return report_error(parsed.status());
  ExportMegatronRequest& req = *parsed;
  ProgressBar bar("export-megatron", stderr_is_tty() && !a.json);
  req.progress = bar.callback();
  auto r = run_export_megatron_job(req);
  bar.finish();
  if (!r.ok()) return report_error(r.status());
  if (a.json) std::printf("%s\n", r->to_json().dump().c_str());
  else if (r->vpp > 1)
    std::printf("wrote %s (%s, tp=%d pp=%d vpp=%d)\n", r->out.c_str(), megatron_format_name(r->format), r->tp, r->pp, r->vpp);
  else std::printf("wrote %s (%s, tp=%d pp=%d)\n", r->out.c_str(), megatron_format_name(r->format), r->tp, r->pp);
  return 0;
}

CommandAction setup_export_megatron(CLI::App& sub) {
  auto a = std::make_shared<ExportArgs>();
  sub.add_option("SRC", a->req.src, "Source checkpoint: native store dir, HF dir, .safetensors file or DCP dir with HF names (with config)")
      ->required();
  sub.add_option("DST", a->req.dst, "Output directory (must not exist; written as DST.partial then renamed)")->required();
  sub.add_option("--tp", a->req.tp, "Tensor-parallel size")->check(CLI::Range(1, 1 << 16));
  sub.add_option("--pp", a->req.pp, "Pipeline-parallel size")->check(CLI::Range(1, 1 << 16));
  sub.add_option("--ep", a->req.ep, "MoE: expert-parallel size (rank files mp_rank_TT[_PPP]_EEE when > 1; default 1)")
      ->check(CLI::Range(1, 1 << 16));
  sub.add_option("--etp", a->req.etp, "MoE: expert tensor-parallel size (default: --tp, as Megatron-Core)")
      ->check(CLI::Range(1, 1 << 16));
  sub.add_option("--pp-layers", a->req.pp_layers, "Layers per pipeline stage, e.g. 1,2,3 (default: even split)")
      ->delimiter(',');
  sub.add_option("--vpp", a->req.vpp,
                 "Virtual (interleaved) pipeline: N model chunks per pipeline stage, chunk c of stage p holding "
                 "Megatron's interleaved layers (c * L/N + p * L/(pp*N), L/(pp*N) each; needs L % (pp*N) == 0, "
                 "an even split, pp > 1). --format torch writes model0..model{N-1} per rank file, torch_dist records "
                 "virtual_pipeline_model_parallel_size (default 1: none)")
      ->check(CLI::Range(1, 1 << 16));
  sub.add_option("--vocab-divisor", a->req.vocab_divisor, "make-vocab-size-divisible-by (default 128)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  sub.add_option("--dtype", a->dtype, "Output dtype (bf16, fp16, fp32); default: the source's");
  sub.add_flag("--local-norms", a->req.local_norms,
               "Local-spec norm names (input_layernorm / pre_mlp_layernorm) instead of Transformer Engine's");
  sub.add_option("--format", a->format,
                 "safetensors (default): DST/mp_rank_*/model.safetensors + megatron_args.json, which ckpt reads back; "
                 "torch: Megatron-LM's own legacy layout, DST/latest_checkpointed_iteration.txt + "
                 "DST/iter_NNNNNNN/mp_rank_TT[_PPP]/model_optim_rng.pt (torch.save files with args, "
                 "checkpoint_version 3.0, iteration, model) that Megatron-LM loads with --load DST; "
                 "torch_dist: a Megatron-Core dist_checkpointing directory (PyTorch DCP: __R_K.distcp, .metadata, "
                 "the common state (common_state item, or common.pt before 0.19), metadata.json) that "
                 "megatron.core.dist_checkpointing.load accepts")
      ->check(CLI::IsMember({"safetensors", "torch", "torch_dist"}));
  sub.add_option("--iteration", a->req.iteration, "--format torch: the iteration the checkpoint is saved as (default 0)")
      ->check(CLI::Range(int64_t{0}, int64_t{9999999}));
  sub.add_option("--megatron-version", a->req.megatron_version,
                 "--format torch_dist: the megatron-core version whose layout is written: 0.19 (default, the newest: the common state "
                 "as the DCP item common_state, metadata.json without common_backend) or 0.16, 0.17, 0.18 (common.pt)")
      ->check(CLI::IsMember({"0.16", "0.17", "0.18", "0.19"}));
  sub.add_flag("--dist-opt", a->req.dist_opt,
               "Write the source's optimizer state (fp32 masters, exp_avg, exp_avg_sq, step) as Megatron's distributed "
               "optimizer (--use-distributed-optimizer): --format torch: distrib_optim.pt beside each rank file; "
               "torch_dist: the dp_reshardable buckets. Needs --local-norms and a source with both Adam moments");
  sub.add_option("--dp", a->req.dp, "--dist-opt: the data-parallel size the buckets are padded for (default 1)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  sub.add_option("--ddp-bucket-size", a->req.ddp_bucket_size,
                 "--dist-opt: DDP bucket size in elements (Megatron-LM --ddp-bucket-size, with overlap_grad_reduce); "
                 "default: one bucket per grad buffer")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  sub.add_option("--dist-opt-sharding", a->req.dist_opt_sharding,
                 "--dist-opt with --format torch_dist: dp_reshardable (default: the buckets, Megatron-LM's default) or "
                 "fully_reshardable (per parameter: optimizer.state.{param,exp_avg,exp_avg_sq}.<key>; megatron-core "
                 "loads it correctly with one bucket only)")
      ->check(CLI::IsMember({"dp_reshardable", "fully_reshardable"}));
  add_no_verify_flag(sub, a->req.no_verify);
  add_source_profile_flag(sub, a->req.source_profile);
  sub.add_flag("--json", a->json, "Print the result as JSON: out, format, tp, pp, vpp, iteration, dist_opt, dp, source_check");
  return [a] { return run_export(*a); };
}

}  // namespace

CKPT_REGISTER_COMMAND("export-megatron",
                      "Write Megatron-LM checkpoints (per-rank safetensors or torch files, or Megatron-Core torch_dist) from a checkpoint",
                      setup_export_megatron);

}  // namespace ckpt::cli
