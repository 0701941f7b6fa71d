// PlanCost::to_json / to_text (trainer/plan/cost_model.h).
#include <cstdio>
#include <string>
#include <vector>

#include "trainer/plan/cost_model.h"

namespace ckpt::trainer {

nlohmann::json PlanCost::to_json() const {
  nlohmann::json st = nlohmann::json::array();
  for (const StageCost& c : stages)
    st.push_back({{"pipeline", c.pipeline}, {"stage", c.stage}, {"first_layer", c.first_layer}, {"layers", c.layers},
                  {"tp", c.tp}, {"device", c.device}, {"flops_per_micro_batch", c.flops}, {"compute_s", c.compute_s},
                  {"tp_comm_s", c.tp_comm_s}, {"p2p_s", c.p2p_s},
                  {"a2a_s", c.a2a_s}, {"ep", c.ep}, {"etp", c.etp}, {"time_s", c.time_s()}, {"dp_sync_s", c.dp_sync_s},
                  {"update_s", c.update_s}, {"a2a_trainer_s", c.a2a_trainer_s},
                  {"memory_bytes", c.memory()}, {"weights_bytes", c.weights}, {"grads_bytes", c.grads},
                  {"optimizer_bytes", c.optimizer}, {"activations_bytes", c.activations}, {"capacity_bytes", c.capacity}});
  nlohmann::json pl = nlohmann::json::array();
  for (size_t p = 0; p < pipelines.size(); ++p) {
    const PipelineCost& c = pipelines[p];
    nlohmann::json times = nlohmann::json::array();
    for (const StageCost& x : stages)
      if (x.pipeline == static_cast<int>(p)) times.push_back(x.time_s());
    pl.push_back({{"pipeline", p}, {"micro_batch", c.micro_batch}, {"micro_batches", c.micro_batches}, {"stages", c.stages},
                  {"time_s", c.time_s}, {"bubble_s", c.bubble_s}, {"dp_sync_s", c.dp_sync_s},
                  {"update_s", c.update_s}, {"stage_times_s", times}});
  }
  nlohmann::json rk = nlohmann::json::array();
  for (const RankCost& r : ranks)
    rk.push_back({{"rank", r.rank}, {"cluster_rank", r.cluster_rank}, {"pipeline", r.pipeline}, {"stage", r.stage},
                  {"node", r.node}, {"device", r.device}, {"memory_bytes", r.memory}, {"capacity_bytes", r.capacity},
                  {"memory_fraction", r.capacity ? static_cast<double>(r.memory) / static_cast<double>(r.capacity) : 0.0},
                  {"compute_fraction", r.compute_fraction}});
  return {{"feasible", feasible}, {"problems", problems}, {"memory_model", memory_model}, {"step_time_s", step_time_s},
          {"tokens_per_s", tokens_per_s}, {"flops_per_step", flops_per_step}, {"mfu", mfu}, {"global_batch", global_batch}, {"seq_len", seq_len},
          {"ep", ep}, {"etp", etp}, {"a2a_s_per_step", a2a_s_per_step}, {"a2a_share", step_time_s > 0 ? a2a_s_per_step / step_time_s : 0.0},
          {"pipelines", pl}, {"stages", st}, {"ranks", rk}};
}

std::string PlanCost::to_text() const {
  std::string out;
  char buf[512];
  std::snprintf(buf, sizeof buf, "predicted step %.6g s, %.6g tokens/s, MFU %.1f%%%s\n", step_time_s, tokens_per_s, 100 * mfu,
                feasible ? "" : "  (DOES NOT FIT)");
  out += buf;
  if (ep > 1 || a2a_s_per_step > 0) {
    std::snprintf(buf, sizeof buf,
                  "experts: ep %d etp %d, all-to-all %.4g s per step as `ckpt train` counts it (a2a %.1f%%; docs/PLAN.md \"Mixture of experts\": "
                  "which layouts `ckpt train` runs)\n", ep, etp, a2a_s_per_step,
                  step_time_s > 0 ? 100 * a2a_s_per_step / step_time_s : 0.0);
    out += buf;
  }
  out += "memory model: " + memory_model +
         (memory_model == "embedded" ? " (`ckpt train`'s own estimate: fp32, workspace, buffers, checkpoint staging, process constant)\n"
                                     : " (real precision: weights and gradients in the device dtype, fp32 Adam; no process constant; "
                                       "for `ckpt train`: --memory-model embedded)\n");
  for (const std::string& p : problems) out += "  does not fit: " + p + "\n";
  // Each pipeline's block; consecutive equal blocks are printed once ("pipelines 0..63 (64 x)").
  std::vector<std::string> blocks(pipelines.size());
  size_t k = 0;
  for (size_t p = 0; p < pipelines.size(); ++p) {
    const PipelineCost& c = pipelines[p];
    std::snprintf(buf, sizeof buf, "micro-batch %d x %lld, %d stages, %.6g s (bubble %.6g s, dp sync %.6g s%s)\n", c.micro_batch,
                  static_cast<long long>(c.micro_batches), c.stages, c.time_s, c.bubble_s, c.dp_sync_s,
                  c.update_s > 0 ? (", optimizer update " + std::to_string(c.update_s) + " s").c_str() : "");
    blocks[p] = buf;
    for (; k < stages.size() && stages[k].pipeline == static_cast<int>(p); ++k) {
      const StageCost& x = stages[k];
      std::snprintf(buf, sizeof buf,
                    "  stage %d: layers %d..%d tp %d on %-10s %.4g s/micro-batch (compute %.4g, tp %.4g, p2p %.4g%s), "
                    "memory %.3f / %.3f GiB per rank\n",
                    x.stage, x.first_layer, x.first_layer + x.layers - 1, x.tp, x.device.c_str(), x.time_s(), x.compute_s,
                    x.tp_comm_s, x.p2p_s, x.a2a_s > 0 ? (", a2a " + std::to_string(x.a2a_s)).c_str() : "",
                    static_cast<double>(x.memory()) / 1073741824.0,
                    static_cast<double>(x.capacity) / 1073741824.0);
      blocks[p] += buf;
    }
  }
  for (size_t p = 0; p < blocks.size();) {
    size_t q = p + 1;
    while (q < blocks.size() && blocks[q] == blocks[p]) ++q;
    out += q - p == 1 ? "pipeline " + std::to_string(p) + ": "
                      : "pipelines " + std::to_string(p) + ".." + std::to_string(q - 1) + " (" + std::to_string(q - p) + " x): ";
    out += blocks[p];
    p = q;
  }
  return out;
}

std::string layout_text(const Layout& l) {
  if (l.pipelines.empty()) return l.to_string();
  std::string s = std::to_string(l.pipelines.size()) + " pipeline" + (l.pipelines.size() == 1 ? "" : "s") + ": ";
  for (size_t p = 0; p < l.pipelines.size();) {
    size_t q = p + 1;
    while (q < l.pipelines.size() && l.pipelines[q] == l.pipelines[p]) ++q;
    const PipelineSpec& pl = l.pipelines[p];
    s += (p ? ", " : "") + (q - p > 1 ? std::to_string(q - p) + " x " : std::string()) + "mb=" + std::to_string(pl.micro_batch) + " [";
    for (size_t k = 0; k < pl.stages.size(); ++k) {
      const StageSpec& st = pl.stages[k];
      s += (k ? " | " : "") + std::to_string(st.layers) + " tp" + std::to_string(st.tp);
      if (!st.device.empty()) s += " " + st.device;
    }
    s += "]";
    p = q;
  }
  return s + " zero=" + std::to_string(l.zero);
}

}  // namespace ckpt::trainer
