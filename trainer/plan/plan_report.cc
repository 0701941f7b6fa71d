// PlanCost::to_json / to_text (trainer/plan/cost_model.h).
#include <cstdio>

#include "trainer/plan/cost_model.h"

namespace ckpt::trainer {

nlohmann::json PlanCost::to_json() const {
  nlohmann::json st = nlohmann::json::array();
  for (const StageCost& c : stages)
    st.push_back({{"pipeline", c.pipeline}, {"stage", c.stage}, {"first_layer", c.first_layer}, {"layers", c.layers},
                  {"tp", c.tp}, {"device", c.device}, {"flops_per_micro_batch", c.flops}, {"compute_s", c.compute_s},
                  {"tp_comm_s", c.tp_comm_s}, {"p2p_s", c.p2p_s}, {"time_s", c.time_s()}, {"dp_sync_s", c.dp_sync_s},
                  {"memory_bytes", c.memory()}, {"weights_bytes", c.weights}, {"grads_bytes", c.grads},
                  {"optimizer_bytes", c.optimizer}, {"activations_bytes", c.activations}, {"capacity_bytes", c.capacity}});
  nlohmann::json pl = nlohmann::json::array();
  for (size_t p = 0; p < pipelines.size(); ++p) {
    const PipelineCost& c = pipelines[p];
    nlohmann::json times = nlohmann::json::array();
    for (const StageCost& x : stages)
      if (x.pipeline == static_cast<int>(p)) times.push_back(x.time_s());
    pl.push_back({{"pipeline", p}, {"micro_batch", c.micro_batch}, {"micro_batches", c.micro_batches}, {"stages", c.stages},
                  {"time_s", c.time_s}, {"bubble_s", c.bubble_s}, {"dp_sync_s", c.dp_sync_s}, {"stage_times_s", times}});
  }
  nlohmann::json rk = nlohmann::json::array();
  for (const RankCost& r : ranks)
    rk.push_back({{"rank", r.rank}, {"cluster_rank", r.cluster_rank}, {"pipeline", r.pipeline}, {"stage", r.stage},
                  {"node", r.node}, {"device", r.device}, {"memory_bytes", r.memory}, {"capacity_bytes", r.capacity},
                  {"memory_fraction", r.capacity ? static_cast<double>(r.memory) / static_cast<double>(r.capacity) : 0.0},
                  {"compute_fraction", r.compute_fraction}});
  return {{"feasible", feasible}, {"problems", problems}, {"step_time_s", step_time_s}, {"tokens_per_s", tokens_per_s},
          {"flops_per_step", flops_per_step}, {"mfu", mfu}, {"global_batch", global_batch}, {"seq_len", seq_len},
          {"pipelines", pl}, {"stages", st}, {"ranks", rk}};
}

std::string PlanCost::to_text() const {
  std::string out;
  char buf[512];
  std::snprintf(buf, sizeof buf, "predicted step %.6g s, %.6g tokens/s, MFU %.1f%%%s\n", step_time_s, tokens_per_s, 100 * mfu,
                feasible ? "" : "  (DOES NOT FIT)");
  out += buf;
  for (const std::string& p : problems) out += "  does not fit: " + p + "\n";
  for (size_t p = 0; p < pipelines.size(); ++p) {
    const PipelineCost& c = pipelines[p];
    std::snprintf(buf, sizeof buf, "pipeline %zu: micro-batch %d x %lld, %d stages, %.6g s (bubble %.6g s, dp sync %.6g s)\n", p,
                  c.micro_batch, static_cast<long long>(c.micro_batches), c.stages, c.time_s, c.bubble_s, c.dp_sync_s);
    out += buf;
    for (const StageCost& x : stages) {
      if (x.pipeline != static_cast<int>(p)) continue;
      std::snprintf(buf, sizeof buf,
                    "  stage %d: layers %d..%d tp %d on %-10s %.4g s/micro-batch (compute %.4g, tp %.4g, p2p %.4g), "
                    "memory %.3f / %.3f GiB per rank\n",
                    x.stage, x.first_layer, x.first_layer + x.layers - 1, x.tp, x.device.c_str(), x.time_s(), x.compute_s,
                    x.tp_comm_s, x.p2p_s, static_cast<double>(x.memory()) / 1073741824.0,
                    static_cast<double>(x.capacity) / 1073741824.0);
      out += buf;
    }
  }
  return out;
}

}  // namespace ckpt::trainer
