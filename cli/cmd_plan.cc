// ckpt plan: the cost-model planner (trainer/plan/; docs/PLAN.md). Parses flags and prints; the
// cost model, the search and the re-plan live in trainer/plan/.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "converters/jobs/reshard_job.h"
#include "converters/model/llama_config.h"
#include "formats/base/fs_util.h"
#include "reshard/layout/layout.h"
#include "trainer/plan/calibrate.h"
#include "trainer/plan/cost_model.h"
#include "trainer/plan/plan_job.h"
#include "trainer/plan/replan.h"
#include "trainer/plan/search.h"

namespace ckpt::cli {
namespace {

struct PlanFlags {
  std::string cluster, model, out, evaluate, from, reshard, calibration, memory_model = "megatron";
  double router_load = 1;
  int64_t global_batch = 0, seq_len = 0;
  int top = 3;
  bool explain = false, json = false, calibrate = false, trainer_memory = false;
  trainer::CalibrateOptions cal;
};

int plan_calibrate(const PlanFlags& f) {
  auto c = trainer::calibrate_device(f.cal);
  if (!c.ok()) return report_error(c.status());
  const std::string text = c->to_json().dump(2) + "\n";
  if (f.out.empty()) {
    std::printf("%s", text.c_str());
    return 0;
  }
  FILE* fp = std::fopen(f.out.c_str(), "w");
  if (!fp || std::fwrite(text.data(), 1, text.size(), fp) != text.size() || std::fclose(fp) != 0)
    return report_error(Status::Error("Io", "cannot write '" + f.out + "'"));
  return 0;
}

trainer::PlanRequest plan_request(const PlanFlags& f) {
  trainer::PlanRequest r;
  r.cluster = f.cluster, r.model = f.model, r.evaluate = f.evaluate, r.calibration = f.calibration;
  r.global_batch = f.global_batch, r.seq_len = f.seq_len, r.top = f.top, r.trainer_memory = f.trainer_memory;
  r.memory_model = f.memory_model;
  r.router_load = f.router_load;
  return r;
}

int plan_evaluate(const PlanFlags& f) {
  auto ev = trainer::evaluate_plan(plan_request(f));
  if (!ev.ok()) return report_error(ev.status());
  if (f.json)
    std::printf("%s\n", ev->to_json().dump(2).c_str());
  else
    std::printf("layout %s\n%s", trainer::layout_text(ev->layout).c_str(), ev->cost.to_text().c_str());
  return 0;
}

// The layout file, replaced atomically (a temp name of this process, fsync, rename).
Status plan_write_file(const std::string& path, const std::string& text) { return write_file_atomic(path, text); }

int plan_search(const PlanFlags& f, const LlamaConfig* given = nullptr) {
  auto out = trainer::search_plan(plan_request(f), given);
  if (!out.ok()) return report_error(out.status());
  const auto& r = out->result;
  const auto& best = r.best[0];
  if (!f.out.empty()) {
    Status st = plan_write_file(f.out, best.layout.to_json().dump(2) + "\n");
    if (!st.ok()) return report_error(st);
  }
  if (f.json) {
    std::printf("%s\n", out->to_json().dump(2).c_str());
    return 0;
  }
  std::printf("best layout: %s\n%s", trainer::layout_text(best.layout).c_str(), best.cost.to_text().c_str());
  if (f.explain)
    for (const auto& rc : best.cost.ranks)
      std::printf("  rank %d -> cluster rank %d (%s, %s): memory %.3f / %.3f GiB, compute %.1f%% of peak\n", rc.rank, rc.cluster_rank,
                  rc.node.c_str(), rc.device.c_str(), static_cast<double>(rc.memory) / 1073741824.0,
                  static_cast<double>(rc.capacity) / 1073741824.0, 100 * rc.compute_fraction);
  for (size_t i = 1; i < r.best.size(); ++i) {
    std::printf("next %zu: %s: %.6g s, %s\n", i, trainer::layout_text(r.best[i].layout).c_str(), r.best[i].cost.step_time_s,
                trainer::why_slower(r.best[i], best).c_str());
    if (f.explain) std::printf("%s", r.best[i].cost.to_text().c_str());
  }
  if (out->hand)
    std::printf("hand-written layout (tp = devices per node, even split, equal micro-batches): %s: %.6g s%s; predicted gain %.2fx\n",
                trainer::layout_text(out->hand->layout).c_str(), out->hand->cost.step_time_s, out->hand->cost.feasible ? "" : " (does not fit)",
                out->predicted_gain);
  std::printf("searched %lld arrangements x micro-batch counts, %lld valued below the bound (%lld layouts evaluated, %s) in %.3f s\n",
              static_cast<long long>(r.arrangements), static_cast<long long>(r.visited), static_cast<long long>(r.evaluated),
              r.exhaustive ? "exhaustive" : "pipelines of equal composition, bound-pruned", r.seconds);
  if (!f.out.empty()) std::printf("wrote %s (ckpt train --layout / ckpt reshard --layout)\n", f.out.c_str());
  return 0;
}

// --from CHECKPOINT: the model, batch and sequence length from the checkpoint; the plan for the new
// cluster; the reshard command printed, or run with --reshard DST.
int plan_from(const PlanFlags& flags) {
  auto src = trainer::replan_source(flags.from);
  if (!src.ok()) return report_error(src.status());
  PlanFlags f = flags;
  if (f.global_batch < 1) f.global_batch = src->global_batch;
  if (f.seq_len < 1) f.seq_len = src->seq_len;
  if (f.out.empty()) f.out = f.reshard.empty() ? std::string("planned_layout.json") : f.reshard + ".layout.json";
  if (!f.json)
    std::printf("re-plan of %s (step %lld, layout %s): global batch %lld x %lld tokens\n", src->checkpoint.c_str(),
                static_cast<long long>(src->step), src->layout.to_string().c_str(), static_cast<long long>(f.global_batch),
                static_cast<long long>(f.seq_len));
  const int rc = plan_search(f, &src->config);
  if (rc != 0) return rc;
  if (f.reshard.empty()) {
    if (!f.json) std::printf("move the checkpoint there with:\n  ckpt reshard %s DST --layout %s\n", src->checkpoint.c_str(), f.out.c_str());
    return 0;
  }
  ReshardRequest req;
  req.src = src->checkpoint;
  req.dst = f.reshard;
  auto layout = Layout::from_file(f.out);  // the layout just planned
  if (!layout.ok()) return report_error(layout.status());
  req.layout_file = std::move(layout).value();
  auto r = run_reshard_job(req);
  if (!r.ok()) return report_error(r.status());
  if (!f.json)
    std::printf("resharded %s -> %s (%s) in %.2f s\n", src->checkpoint.c_str(), f.reshard.c_str(), r->layout.to_string().c_str(), r->seconds);
  return 0;
}

int run_plan(const PlanFlags& f) {
  if (f.calibrate) return plan_calibrate(f);
  if (f.cluster.empty()) return report_error(Status::InvalidArgument("ckpt plan needs --cluster FILE (or --calibrate)"));
  if (!f.reshard.empty() && f.from.empty()) return report_error(Status::InvalidArgument("--reshard DST needs --from CHECKPOINT"));
  if (!f.from.empty()) return plan_from(f);
  if (f.from.empty() && (f.model.empty() || f.global_batch < 1))
    return report_error(Status::InvalidArgument("ckpt plan needs --model CONFIG and --global-batch N >= 1 (or --from CHECKPOINT)"));
  if (!f.evaluate.empty()) return plan_evaluate(f);
  return plan_search(f);
}

CommandAction setup_plan(CLI::App& sub) {
  auto f = std::make_shared<PlanFlags>();
  sub.add_option("--cluster", f->cluster,
                 "Cluster JSON file: device types (memory, peak_flops, efficiency, dtype), nodes and links (docs/CLUSTER.md)")
      ->type_name("FILE");
  sub.add_option("--model", f->model, "HF LlamaForCausalLM config.json of the model to place")->type_name("CONFIG");
  sub.add_option("--global-batch", f->global_batch, "Sequences per optimizer step (fixed; the plan divides it over pipelines and micro-batches)");
  sub.add_option("--seq-len", f->seq_len, "Tokens per sequence (default: the model's max_position_embeddings)");
  sub.add_option("-o,--out", f->out,
                 "Write the best layout (for `ckpt train --layout` and `ckpt reshard --layout`); with --calibrate: the device type JSON")
      ->type_name("FILE");
  sub.add_option("--top", f->top, "How many layouts to show (the best and the next ones, with why they lose)")->capture_default_str();
  sub.add_flag("--explain", f->explain, "Print every shown layout's per-stage times and per-rank memory");
  sub.add_flag("--json", f->json, "Print JSON (step_time_s, tokens_per_s, stages, pipelines, ranks, feasible, problems)");
  sub.add_option("--memory-model", f->memory_model,
                 "Whose memory the plan assumes: 'megatron' (a real-precision stack: dtype weights and gradients, fp32 Adam) or "
                 "'embedded' (`ckpt train`'s own estimate, trainer/memory_estimate.h: a plan that `ckpt train --cluster` accepts)")
      ->capture_default_str();
  sub.add_option("--router-load", f->router_load,
                 "MoE: the routing imbalance assumed, the most loaded expert's tokens over the mean (`ckpt train`'s router_load); "
                 "1: balanced")
      ->capture_default_str();
  sub.add_flag("--trainer-memory", f->trainer_memory,
               "With --evaluate --json: also every rank's memory as `ckpt train` allocates it (fp32, trainer/memory_estimate.h): "
               "ranks[].trainer_memory_bytes");
  sub.add_option("--calibration", f->calibration,
                 "Apply the measured cost terms of `ckpt plan --calibrate -o FILE` (concurrency, TP all-reduce per call, "
                 "per-micro-batch cost; docs/PLAN.md \"Calibrated terms\") to every device type: for clusters that run this "
                 "machine's training stack, e.g. `ckpt train --emulate`")
      ->type_name("FILE");
  sub.add_option("--evaluate", f->evaluate, "Predict the step time and memory of this layout file instead of searching")->type_name("LAYOUT");
  sub.add_option("--from", f->from, "Re-plan: take the model, batch and sequence length from this checkpoint (or run dir)")->type_name("CHECKPOINT");
  sub.add_option("--reshard", f->reshard, "With --from: reshard the checkpoint into the planned layout at DST (else the command is printed)")
      ->type_name("DST");
  sub.add_flag("--calibrate", f->calibrate, "Measure this machine (sgemm FLOP/s, efficiency, MPI bandwidth) and print a cluster-file device type");
  sub.footer(
      "Examples:\n"
      "  ckpt plan --cluster cluster.json --model config.json --global-batch 64 --seq-len 2048 -o layout.json\n"
      "  ckpt plan --cluster cluster.json --model config.json --global-batch 64 --evaluate layout.json --json\n"
      "  ckpt plan --from run/latest --cluster new_cluster.json --reshard run2/step-00000100\n"
      "  ckpt plan --calibrate -o cal.json && ckpt plan --cluster c.json --model m.json --global-batch 8 --calibration cal.json\n"
      "The cost model and the search space are in docs/PLAN.md; predictions are of a real-precision training on\n"
      "the cluster file's devices (weights, gradients and activations in each device type's dtype, fp32 Adam state).");
  return [f] { return run_plan(*f); };
}

}  // namespace

CKPT_REGISTER_COMMAND("plan", "Plan the layout of a model on a (mixed) cluster with a cost model; predict a layout's step time", setup_plan);

}  // namespace ckpt::cli
