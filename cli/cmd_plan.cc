// ckpt plan: the cost-model planner (trainer/plan/; docs/PLAN.md). Parses flags and prints; the
// cost model, the search and the re-plan live in trainer/plan/.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "converters/llama_config.h"
#include "reshard/cluster.h"
#include "reshard/layout.h"
#include "trainer/plan/calibrate.h"
#include "trainer/plan/cost_model.h"

namespace ckpt::cli {
namespace {

struct PlanFlags {
  std::string cluster, model, out, evaluate, from, reshard;
  int64_t global_batch = 0, seq_len = 0;
  int top = 3;
  bool explain = false, json = false, calibrate = false;
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

int plan_evaluate(const PlanFlags& f) {
  auto cluster = Cluster::from_file(f.cluster);
  if (!cluster.ok()) return report_error(cluster.status());
  auto cfg = LlamaConfig::from_file(f.model);
  if (!cfg.ok()) return report_error(cfg.status());
  auto layout = Layout::from_file(f.evaluate);
  if (!layout.ok()) return report_error(layout.status());
  trainer::PlanOptions o;
  o.global_batch = f.global_batch;
  o.seq_len = f.seq_len > 0 ? f.seq_len : cfg->max_position_embeddings;
  auto cost = trainer::evaluate(trainer::ModelSpec::from_config(*cfg), *cluster, *layout, o);
  if (!cost.ok()) return report_error(cost.take_status().with_file(f.evaluate));
  if (f.json) {
    nlohmann::json j = cost->to_json();
    j["layout"] = layout->to_json();
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("layout %s\n%s", layout->to_string().c_str(), cost->to_text().c_str());
  }
  return 0;
}

int run_plan(const PlanFlags& f) {
  if (f.calibrate) return plan_calibrate(f);
  if (f.cluster.empty()) return report_error(Status::InvalidArgument("ckpt plan needs --cluster FILE (or --calibrate)"));
  if (f.from.empty() && (f.model.empty() || f.global_batch < 1))
    return report_error(Status::InvalidArgument("ckpt plan needs --model CONFIG and --global-batch N >= 1 (or --from CHECKPOINT)"));
  if (!f.evaluate.empty()) return plan_evaluate(f);
  return report_error(Status::Unsupported("the layout search is not built yet"));
}

CommandAction setup_plan(CLI::App& sub) {
  auto f = std::make_shared<PlanFlags>();
  sub.add_option("--cluster", f->cluster, "Cluster JSON file: device types (memory, peak_flops, efficiency, dtype), nodes and links (docs/CLUSTER.md)")->type_name("FILE");
  sub.add_option("--model", f->model, "HF LlamaForCausalLM config.json of the model to place")->type_name("CONFIG");
  sub.add_option("--global-batch", f->global_batch, "Sequences per optimizer step (fixed; the plan divides it over pipelines and micro-batches)");
  sub.add_option("--seq-len", f->seq_len, "Tokens per sequence (default: the model's max_position_embeddings)");
  sub.add_option("-o,--out", f->out, "Write the best layout (for `ckpt train --layout` and `ckpt reshard --layout`); with --calibrate: the device type JSON")->type_name("FILE");
  sub.add_option("--top", f->top, "How many layouts to show (the best and the next ones, with why they lose)")->capture_default_str();
  sub.add_flag("--explain", f->explain, "Print every shown layout's per-stage times and per-rank memory");
  sub.add_flag("--json", f->json, "Print JSON (step_time_s, tokens_per_s, stages, pipelines, ranks, feasible, problems)");
  sub.add_option("--evaluate", f->evaluate, "Predict the step time and memory of this layout file instead of searching")->type_name("LAYOUT");
  sub.add_option("--from", f->from, "Re-plan: take the model, batch and sequence length from this checkpoint (or run dir)")->type_name("CHECKPOINT");
  sub.add_option("--reshard", f->reshard, "With --from: reshard the checkpoint into the planned layout at DST (else the command is printed)")->type_name("DST");
  sub.add_flag("--calibrate", f->calibrate, "Measure this machine (sgemm FLOP/s, efficiency, MPI bandwidth) and print a cluster-file device type");
  sub.footer(
      "Examples:\n"
      "  ckpt plan --cluster cluster.json --model config.json --global-batch 64 --seq-len 2048 -o layout.json\n"
      "  ckpt plan --cluster cluster.json --model config.json --global-batch 64 --evaluate layout.json --json\n"
      "  ckpt plan --from run/latest --cluster new_cluster.json --reshard run2/step-00000100\n"
      "The cost model and the search space are in docs/PLAN.md; predictions are of a real-precision training on\n"
      "the cluster file's devices (weights, gradients and activations in each device type's dtype, fp32 Adam state).");
  return [f] { return run_plan(*f); };
}

}  // namespace

CKPT_REGISTER_COMMAND("plan", "Plan the layout of a model on a (mixed) cluster with a cost model; predict a layout's step time", setup_plan);

}  // namespace ckpt::cli
