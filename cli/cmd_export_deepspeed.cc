// ckpt export-deepspeed SRC OUT: writes a checkpoint (any kind ckpt reads) as a DeepSpeed universal
// checkpoint that DeepSpeed resumes from with `"checkpoint": {"load_universal": true}` at any ZeRO
// stage and world size, the Adam state included. The work is converters/jobs/export_deepspeed_job.h;
// this file parses the flags, draws the progress bar and prints the summary.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/progress.h"
#include "converters/jobs/export_deepspeed_job.h"

namespace ckpt::cli {
namespace {

CommandAction setup_export_deepspeed(CLI::App& sub) {
  struct Opts {
    std::string src, out;
    int64_t step = -1;
    WriteFlags write;
    bool weights_only = false, int_step = false, json = false;
  };
  auto o = std::make_shared<Opts>();
  sub.add_option("SRC", o->src, "any checkpoint ckpt opens: DeepSpeed ZeRO dir, native store, Megatron, HuggingFace dir, ...")->required();
  sub.add_option("OUT", o->out, "output directory, DeepSpeed's load_dir (must not exist)")->required();
  sub.add_flag("--weights-only", o->weights_only,
               "SRC without Adam state (an HF model): write zero moments and step 0, the state a new Adam starts from");
  sub.add_flag("--int-step", o->int_step, "write the Adam step as a Python int (DeepSpeed's FusedAdam / DeepSpeedCPUAdam) instead "
                                          "of the 0-d float tensor torch's Adam/AdamW keep");
  sub.add_option("--step", o->step, "the Adam step to write (default: the one SRC records)")->check(CLI::Range(int64_t{0}, int64_t{1} << 62));
  o->write.add(sub);
  sub.add_flag("--json", o->json, "print a JSON summary on stdout");
  sub.footer(
      "Writes what DeepSpeed's ds_to_universal.py writes: OUT/latest_universal, OUT/global_stepN/ with\n"
      "mp_rank_00_model_states.pt, zero_pp_rank_0_mp_rank_00_model_states.pt, zero/optimizer_state.pt and\n"
      "zero/<param>/{fp32,exp_avg,exp_avg_sq,step}.pt under the HF parameter names. Resume with\n"
      "    engine.load_checkpoint(OUT)   # DeepSpeed config: \"checkpoint\": {\"load_universal\": true}\n"
      "(load_lr_scheduler_states=False when the engine has a scheduler: none is written). docs/DEEPSPEED.md.\n"
      "The directory is built as OUT.partial and renamed when complete; on failure nothing is left at OUT.");
  return [o]() -> int {
    auto parsed = [&]() -> Result<ExportDeepSpeedRequest> {
      ExportDeepSpeedRequest req;
      req.src = o->src;
      req.out = o->out;
      req.weights_only = o->weights_only;
      req.int_step = o->int_step;
      if (o->step >= 0) req.step = o->step;
      CKPT_RETURN_IF_ERROR(o->write.fill(req));
      return req;
    }();
    if (!parsed.ok()) return report_error(parsed.status());
    ExportDeepSpeedRequest& req = *parsed;
    ProgressBar bar("export-deepspeed", stderr_is_tty());
    req.progress = bar.callback();
    auto r = run_export_deepspeed_job(req);
    bar.finish();
    if (!r.ok()) return report_error(r.status());
    o->write.stream.print_memory_note(r->memory);
    if (o->json) {
      std::printf("%s\n", r->to_json().dump().c_str());
    } else {
      std::printf("wrote %zu parameters (%llu tensor bytes, Adam step %lld%s) as a DeepSpeed universal checkpoint '%s' to %s\n",
                  r->params, static_cast<unsigned long long>(r->bytes), static_cast<long long>(r->step),
                  r->fresh_adam ? ", fresh Adam state: SRC has none" : "", r->tag.c_str(), r->out.c_str());
    }
    return 0;
  };
}

CKPT_REGISTER_COMMAND("export-deepspeed", "Write a DeepSpeed universal checkpoint (weights and Adam state) that DeepSpeed resumes from",
                      setup_export_deepspeed);

}  // namespace
}  // namespace ckpt::cli
