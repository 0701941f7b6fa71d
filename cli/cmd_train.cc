// `ckpt train`: the single-process reference trainer (parsing only; logic in trainer/).
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/progress.h"
#include "converters/model/llama_config.h"
#include "formats/base/int_list.h"
#include "formats/store/store_options.h"
#include "trainer/train_loop.h"

namespace ckpt::cli {
namespace {

struct TrainFlags {
  std::string config;
  trainer::TrainOptions o;
  bool sync_save = false;
  LayoutFlags layout;
  std::string micro_batches;
  std::string digest = "xxh3-128";
};

constexpr const char* kTrainFooter =
      "Parallel runs: mpirun -np N ckpt train ... --tp T --pp P [--pp-layers a,b,..] --dp D [--micro-batches a,b,..] [--zero 1]\n"
      "with N = T*P*D. Ranks follow Megatron-LM: rank = (pp_rank*dp + dp_rank)*tp + tp_rank. Every DP rank runs\n"
      "--grad-accum micro-batches of its own size per step; the global batch is grad-accum * sum(micro-batches)\n"
      "and the update equals the one-process update for the same global batch. --resume accepts a checkpoint of\n"
      "any layout (the global batch and seq-len must match). A general --layout FILE (per-stage tp, per-pipeline\n"
      "stage splits and micro-batches) runs on N = the sum of its stages' tp ranks (docs/TRAINER.md).\n"
      "Mixture-of-experts configs (Mixtral, Qwen2-MoE, Qwen3-MoE) train with the load-balancing loss, over pipeline\n"
      "stages, TP (each expert's width split over the stage's tp ranks) and DP, or with expert parallelism\n"
      "(--ep E [--etp T]: experts spread over each stage's tp x dp ranks, tokens dispatched all-to-all);\n"
      "--init STORE starts from an imported HF model (`ckpt from-hf`).";

CommandAction setup_train(CLI::App& sub) {
  auto f = std::make_shared<TrainFlags>();
  sub.add_option("--config", f->config,
                 "HF config.json: LlamaForCausalLM, or Mixtral / Qwen2-MoE / Qwen3-MoE (e.g. fixtures/tiny_llama.json)")
      ->required();
  sub.add_option("--steps", f->o.steps, "Train until this many optimizer steps are done")->capture_default_str();
  sub.add_option("--total-steps", f->o.total_steps, "LR schedule horizon (default: --steps)");
  sub.add_option("--save-every", f->o.save_every, "Checkpoint every K steps (0: only at the end)")->capture_default_str();
  sub.add_option("--out", f->o.out_dir, "Run directory: step-XXXXXXXX checkpoints, latest, train_log.jsonl");
  sub.add_option("--resume", f->o.resume,
                 "Resume from a checkpoint or run dir, or 'latest' (of --out); any layout and any profile (converted "
                 "on the way in)");
  sub.add_option("--init", f->o.init,
                 "Start a new run (step 0, new optimizer state) from the weights of a checkpoint with this config, "
                 "e.g. `ckpt from-hf` of an HF model (Mixtral / Qwen-MoE included)");
  sub.add_option("--seed", f->o.seed, "Seed of the initialization and the data stream")->capture_default_str();
  sub.add_option("--lr", f->o.lr, "Peak learning rate")->capture_default_str();
  sub.add_option("--warmup", f->o.warmup, "Linear warm-up steps")->capture_default_str();
  sub.add_option("--micro-batch", f->o.micro_batch, "Sequences per micro-batch, on every data-parallel rank (see --micro-batches)")
      ->capture_default_str();
  sub.add_option("--seq-len", f->o.seq_len, "Tokens per sequence")->capture_default_str();
  sub.add_option("--grad-accum", f->o.grad_accum, "Micro-batches per optimizer step, on every data-parallel rank")->capture_default_str();
  sub.add_option("--threads", f->o.threads, "OpenBLAS threads")->capture_default_str();
  sub.add_option("--data", f->o.data_path, "Corpus file (bytes are tokens); default: procedural corpus");
  sub.add_option("--weight-decay", f->o.adam.weight_decay, "AdamW weight decay")->capture_default_str();
  sub.add_option("--clip", f->o.max_grad_norm, "Global gradient-norm clip (0: off)")->capture_default_str();
  sub.add_flag("--sync-save", f->sync_save, "Write checkpoints synchronously (default: background thread)");
  sub.add_option("--digest", f->digest, store::kDigestFlagHelp);
  f->layout.add(sub, "ZeRO stage: 0 (optimizer state replicated over DP) or 1 (sharded over DP ranks)");
  sub.add_option("--layout", f->o.layout_file, "Layout JSON file (as `ckpt reshard --layout`; symmetric or general: pipelines of stages, "
                 "each with its layers, tp and device type); excludes --tp/--pp/--pp-layers/--dp/--zero");
  sub.add_option("--cluster", f->o.cluster_file,
                 "Cluster JSON file: device types (memory, FLOP/s, link bandwidth, dtype) and how many ranks of each, in "
                 "rank order. The layout's device types must match it, and every rank's estimated memory (weights, "
                 "gradients, optimizer state, activations of the micro-batches in flight) must fit its device, else "
                 "the run stops before training naming the rank; at the end, estimate vs peak RSS per rank is printed "
                 "(with --out, always written to RUN_DIR/memory.json). A device type's \"profile\" (e.g. "
                 "\"megatron-mcore\") names its stack's storage convention: when every rank's type names the same one, "
                 "checkpoints are stored in it with F32 dtypes (\"<name>.fp32\"), else canonical (docs/TRAINER.md "
                 "\"Profiles\")")
      ->type_name("FILE");
  sub.add_flag("--emulate", f->o.emulate,
               "Emulate the --cluster file's device types on this machine: after each compute section (forward or "
               "backward of a micro-batch, optimizer update) a rank sleeps t x (fastest type's speed / its type's "
               "speed - 1), speed = peak_flops x efficiency; memory is capped by the cluster check; every log line, "
               "train_log.jsonl record (\"emulated\", \"rank_compute_s\") and the start line say the run is emulated");
  sub.add_option("--micro-batches", f->micro_batches,
                 "Per data-parallel rank (pipeline) micro-batch sizes a,b,.. (heterogeneous DP); default: the layout file's, else "
                 "--micro-batch on every rank");
  sub.add_option("--dump-grads", f->o.dump_grads,
                 "Write the first step's gradients (global view, after the DP reduction, before clipping) as a checkpoint to DIR");
  sub.footer(kTrainFooter);
  return [f]() -> int {
    auto cfg = LlamaConfig::from_file(f->config);
    if (!cfg.ok()) return report_error(cfg.status());
    f->o.config = *cfg;
    f->o.async_save = !f->sync_save;
    auto lv = f->layout.values();
    if (!lv.ok()) return report_error(lv.status());
    f->o.layout_values = *lv;
    auto so = store::parse_digest_spec(f->digest, "--digest");
    if (!so.ok()) return report_error(so.status());
    f->o.digest = so->digest;
    if (!f->micro_batches.empty()) {
      auto mb = parse_int_list(f->micro_batches, "--micro-batches");
      if (!mb.ok()) return report_error(mb.status());
      f->o.micro_batches = *mb;
    }
    ProgressBar bar("resume", !f->o.resume.empty() && stderr_is_tty());
    trainer::TrainOptions o = f->o;
    o.resume_progress = bar.callback();
    auto t = trainer::Trainer::create(o);
    bar.finish();
    if (!t.ok()) return report_error(t.status());
    const auto& m = (*t)->model();
    if ((*t)->rank() == 0) {
      std::printf("ckpt train: %s, %lld parameters on rank 0, step %lld -> %lld, global batch %lld x %lld tokens "
                  "(grad-accum %lld), %d thread(s) per rank\n",
                  (*t)->layout().to_string().c_str(), static_cast<long long>(m.num_params()),
                  static_cast<long long>((*t)->step()), static_cast<long long>(f->o.steps),
                  static_cast<long long>((*t)->state().global_batch), static_cast<long long>(f->o.seq_len),
                  static_cast<long long>(f->o.grad_accum), f->o.threads);
      std::fflush(stdout);
    }
    Status st = (*t)->run();
    if (!st.ok()) return report_error(st);
    return 0;
  };
}

CKPT_REGISTER_COMMAND("train", "Train the reference LLaMA model (fp32, OpenBLAS) with checkpoints in the native store",
                      setup_train);

}  // namespace
}  // namespace ckpt::cli
