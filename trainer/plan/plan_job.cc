#include "trainer/plan/plan_job.h"

#include <algorithm>

#include "formats/base/json_read.h"
#include "reshard/dist/cluster.h"
#include "trainer/memory_estimate.h"
#include "trainer/train_profile.h"

namespace ckpt::trainer {

Status check_plan_model(const LlamaConfig& cfg, const std::string& what) {
  if (!cfg.moe || cfg.family == ModelFamily::kMixtral || cfg.family == ModelFamily::kQwen2Moe || cfg.family == ModelFamily::kQwen3Moe)
    return Status::Ok();
  return Status::Error("UnsupportedModel", what + " does not price " + model_type_name(cfg.family) + " models (" +
                                               (cfg.family == ModelFamily::kDeepseekV3 ? "DeepSeek-V3's MLA attention: the trainer has no MLA"
                                                                                      : "its own expert tensors") +
                                               "); it plans dense LLaMA, Mixtral, Qwen2-MoE and Qwen3-MoE (docs/PLAN.md)");
}

namespace {
// The cost model's view of `cfg` with the routing imbalance assumed (BadPlan outside [1, experts]).
Result<ModelSpec> plan_model_spec(const LlamaConfig& cfg, double router_load) {
  ModelSpec m = ModelSpec::from_config(cfg);
  const double hi = m.moe() ? static_cast<double>(m.experts) : 1.0;
  if (!(router_load >= 1 && router_load <= hi))
    return Status::Error("BadPlan", "--router-load " + std::to_string(router_load) + ": expected the most loaded expert's tokens over "
                                    "the mean, in [1, " + std::to_string(static_cast<int64_t>(hi)) + "] for this model");
  m.router_load = router_load;
  return m;
}
}  // namespace

Result<CostCalibration> load_cost_calibration(const std::string& file) {
  if (file.empty()) return CostCalibration{};
  CKPT_ASSIGN_OR_RETURN(auto j, read_json_file(file, kConfigJsonLimits, "calibration"));
  auto c = CostCalibration::from_json(j);
  if (!c.ok()) return c.take_status().with_file(file);
  return c;
}

nlohmann::json PlanEvaluation::to_json() const {
  nlohmann::json j = cost.to_json();
  j["layout"] = layout.to_json();
  for (size_t r = 0; r < trainer_memory.size() && r < j["ranks"].size(); ++r)
    j["ranks"][r]["trainer_memory_bytes"] = trainer_memory[r];
  return j;
}

Result<PlanEvaluation> evaluate_plan(const PlanRequest& req) {
  if (req.global_batch < 1) return Status::InvalidArgument("plan: --global-batch must be >= 1");
  CKPT_ASSIGN_OR_RETURN(auto cal, load_cost_calibration(req.calibration));
  CKPT_ASSIGN_OR_RETURN(auto cluster, Cluster::from_file(req.cluster));
  CKPT_RETURN_IF_ERROR(check_cluster_profiles(cluster, req.cluster));
  CKPT_ASSIGN_OR_RETURN(auto cfg, LlamaConfig::from_file(req.model));
  CKPT_RETURN_IF_ERROR(check_plan_model(cfg, "ckpt plan"));
  PlanEvaluation out;
  CKPT_ASSIGN_OR_RETURN(out.layout, Layout::from_file(req.evaluate));
  PlanOptions o;
  o.global_batch = req.global_batch;
  o.seq_len = req.seq_len > 0 ? req.seq_len : cfg.max_position_embeddings;
  o.calibration = cal;
  CKPT_ASSIGN_OR_RETURN(o.memory_model, parse_memory_model(req.memory_model));
  o.config = &cfg;
  CKPT_ASSIGN_OR_RETURN(const ModelSpec model, plan_model_spec(cfg, req.router_load));
  auto cost = evaluate(model, cluster, out.layout, o);
  if (!cost.ok()) return cost.take_status().with_file(req.evaluate);
  out.cost = std::move(cost).value();
  if (req.trainer_memory) {  // the reference trainer's own allocation (trainer/memory_estimate.h), fp32
    MemoryInputs mi;
    mi.config = cfg, mi.layout = out.layout, mi.seq_len = o.seq_len, mi.mpi = out.layout.world_size() > 1;
    mi.checkpoints = true;  // a run directory, as the embedded memory model assumes
    mi.grad_accum = out.cost.pipelines.empty() ? 1 : out.cost.pipelines[0].micro_batches;
    CKPT_ASSIGN_OR_RETURN(auto est, estimate_memory(mi));
    for (const auto& r : est) out.trainer_memory.push_back(r.total());
  }
  return out;
}

namespace {

nlohmann::json plan_job_candidate_json(const PlanCandidate& c) {
  nlohmann::json j = c.cost.to_json();
  j["layout"] = c.layout.to_json();
  j["layout_text"] = layout_text(c.layout);
  j["placement"] = c.placement;
  return j;
}

}  // namespace

nlohmann::json PlanSearchOutcome::to_json() const {
  const auto& best = result.best[0];
  nlohmann::json j = {{"best", plan_job_candidate_json(best)}, {"seconds", result.seconds},
                      {"arrangements", result.arrangements}, {"evaluated", result.evaluated},
                      {"visited", result.visited},
                      {"exhaustive", result.exhaustive},     {"cross_node_tp", result.cross_node_tp},
                      {"memory_model", best.cost.memory_model}};
  j["next"] = nlohmann::json::array();
  for (size_t i = 1; i < result.best.size(); ++i) {
    nlohmann::json c = plan_job_candidate_json(result.best[i]);
    c["why_slower"] = why_slower(result.best[i], best);
    j["next"].push_back(std::move(c));
  }
  if (hand) j["hand_written"] = plan_job_candidate_json(*hand), j["predicted_gain"] = predicted_gain;
  return j;
}

Result<PlanSearchOutcome> search_plan(const PlanRequest& req, const LlamaConfig* config) {
  if (req.global_batch < 1) return Status::InvalidArgument("plan: --global-batch must be >= 1");
  CKPT_ASSIGN_OR_RETURN(auto cal, load_cost_calibration(req.calibration));
  CKPT_ASSIGN_OR_RETURN(auto cluster, Cluster::from_file(req.cluster));
  CKPT_RETURN_IF_ERROR(check_cluster_profiles(cluster, req.cluster));
  Result<LlamaConfig> cfg = config ? Result<LlamaConfig>(*config) : LlamaConfig::from_file(req.model);
  if (!cfg.ok()) return cfg.take_status();
  CKPT_RETURN_IF_ERROR(check_plan_model(*cfg, "ckpt plan"));
  SearchOptions o;
  o.global_batch = req.global_batch;
  o.seq_len = req.seq_len > 0 ? req.seq_len : cfg->max_position_embeddings;
  o.top = std::max(1, req.top);
  o.calibration = cal;
  CKPT_ASSIGN_OR_RETURN(o.memory_model, parse_memory_model(req.memory_model));
  o.config = &*cfg;
  CKPT_ASSIGN_OR_RETURN(const ModelSpec model, plan_model_spec(*cfg, req.router_load));
  PlanSearchOutcome out;
  CKPT_ASSIGN_OR_RETURN(out.result, search_layouts(model, cluster, o));
  if (out.result.best.empty()) return Status::Internal("plan: the search returned no layout");
  auto hand = hand_written_layout(model, cluster, o);
  if (hand.ok()) {
    out.hand = std::move(hand).value();
    if (out.hand->cost.feasible) out.predicted_gain = out.hand->cost.step_time_s / out.result.best[0].cost.step_time_s;
  }
  return out;
}

}  // namespace ckpt::trainer
