// CostCalibration and the calibrated terms of a stage (trainer/plan/cost_model.h; docs/PLAN.md
// "Calibrated terms").
#include <algorithm>
#include <cmath>

#include "trainer/plan/cost_model.h"

namespace ckpt::trainer {

namespace {
Status calib_terms_bad(const std::string& msg) { return Status::Error("BadCalibration", "calibration cost_terms: " + msg); }

Result<double> calib_terms_number(const nlohmann::json& j, const char* key, double lo, double hi) {
  if (!j.contains(key)) return 0.0;
  const auto& v = j[key];
  if (!v.is_number()) return calib_terms_bad(std::string("'") + key + "' must be a number, got " + v.dump().substr(0, 80));
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi))
    return calib_terms_bad(std::string("'") + key + "' = " + std::to_string(x) + " outside [" + std::to_string(lo) + ", " +
                           std::to_string(hi) + "]");
  return x;
}
}  // namespace

double CostCalibration::speed_scale(int ranks_on_node) const {
  if (concurrency.empty() || ranks_on_node < 1) return 1;
  const double f = concurrency[std::min(concurrency.size(), static_cast<size_t>(ranks_on_node)) - 1];
  const int measured = std::max(cores, static_cast<int>(concurrency.size()));
  return cores > 0 && ranks_on_node > measured ? f * cores / ranks_on_node : f;
}

Result<CostCalibration> CostCalibration::from_json(const nlohmann::json& in) {
  const nlohmann::json& j = in.is_object() && in.contains("cost_terms") ? in["cost_terms"] : in;
  if (!j.is_object()) return calib_terms_bad("expected an object, got " + j.dump().substr(0, 80));
  for (const auto& [k, v] : j.items()) {
    (void)v;
    if (k != "concurrency" && k != "allreduce_latency_s" && k != "allreduce_bytes_per_s" && k != "micro_batch_overhead_s" &&
        k != "p2p_latency_s" && k != "a2a_latency_s" && k != "a2a_bytes_per_s" && k != "update_params_per_s" &&
        k != "sync_bytes_per_s" && k != "cores" && k != "measured")
      return calib_terms_bad("unknown key '" + k + "'");
  }
  CostCalibration c;
  if (j.contains("concurrency")) {
    const auto& a = j["concurrency"];
    if (!a.is_array() || a.size() > 4096) return calib_terms_bad("'concurrency' must be an array of at most 4096 factors");
    for (const auto& x : a) {
      if (!x.is_number() || !(x.get<double>() > 0 && x.get<double>() <= 1))
        return calib_terms_bad("'concurrency' factors must be numbers in (0, 1], got " + x.dump().substr(0, 80));
      c.concurrency.push_back(x.get<double>());
    }
  }
  CKPT_ASSIGN_OR_RETURN(const double cores, calib_terms_number(j, "cores", 0, 1 << 20));
  if (cores != static_cast<int>(cores)) return calib_terms_bad("'cores' must be a whole number, got " + std::to_string(cores));
  c.cores = static_cast<int>(cores);
  CKPT_ASSIGN_OR_RETURN(c.allreduce_latency_s, calib_terms_number(j, "allreduce_latency_s", 0, 10));
  CKPT_ASSIGN_OR_RETURN(c.allreduce_bytes_per_s, calib_terms_number(j, "allreduce_bytes_per_s", 0, 1e15));
  CKPT_ASSIGN_OR_RETURN(c.micro_batch_overhead_s, calib_terms_number(j, "micro_batch_overhead_s", 0, 10));
  CKPT_ASSIGN_OR_RETURN(c.p2p_latency_s, calib_terms_number(j, "p2p_latency_s", 0, 10));
  CKPT_ASSIGN_OR_RETURN(c.a2a_latency_s, calib_terms_number(j, "a2a_latency_s", 0, 10));
  CKPT_ASSIGN_OR_RETURN(c.a2a_bytes_per_s, calib_terms_number(j, "a2a_bytes_per_s", 0, 1e15));
  CKPT_ASSIGN_OR_RETURN(c.update_params_per_s, calib_terms_number(j, "update_params_per_s", 0, 1e15));
  CKPT_ASSIGN_OR_RETURN(c.sync_bytes_per_s, calib_terms_number(j, "sync_bytes_per_s", 0, 1e15));
  return c;
}

nlohmann::json CostCalibration::to_json() const {
  return {{"concurrency", concurrency},
          {"allreduce_latency_s", allreduce_latency_s},
          {"allreduce_bytes_per_s", allreduce_bytes_per_s},
          {"micro_batch_overhead_s", micro_batch_overhead_s},
          {"p2p_latency_s", p2p_latency_s},
          {"a2a_latency_s", a2a_latency_s},
          {"a2a_bytes_per_s", a2a_bytes_per_s},
          {"update_params_per_s", update_params_per_s},
          {"sync_bytes_per_s", sync_bytes_per_s},
          {"cores", cores}};
}

std::vector<int> ranks_per_node(const Cluster& c, const std::vector<int>& used) {
  std::vector<int> n(static_cast<size_t>(c.num_nodes()), 0);
  for (int r : used) ++n[static_cast<size_t>(c.node_of(r))];
  return n;
}

void apply_calibration(StagePlace& place, const Cluster& c, const std::vector<int>& ranks, const std::vector<int>& ranks_on_node,
                       const CostCalibration& cal, const std::vector<int>& prev, const std::vector<int>& next) {
  place.speed_scale = 1;
  for (int r : ranks) {
    const size_t node = static_cast<size_t>(c.node_of(r));
    place.speed_scale = std::min(place.speed_scale, cal.speed_scale(node < ranks_on_node.size() ? ranks_on_node[node] : 1));
  }
  place.micro_batch_overhead_s = cal.micro_batch_overhead_s;
  bool one_node = true;
  for (int r : ranks) one_node = one_node && c.node_of(r) == c.node_of(ranks[0]);
  if (cal.allreduce_bytes_per_s > 0 && one_node && ranks.size() > 1)
    place.tp_link = LinkSpec{cal.allreduce_bytes_per_s, cal.allreduce_latency_s / 2};
  // The gradient syncs (a Comm all-reduce of MBs over the replicas or the EP group's peers): measured on a one-node cluster.
  if (cal.sync_bytes_per_s > 0 && c.num_nodes() == 1) place.sync_link = LinkSpec{cal.sync_bytes_per_s, cal.allreduce_latency_s / 2};
  place.update_params_per_s = cal.update_params_per_s;
  // The expert all-to-all spans the stage's replicas too: measured terms only on a one-node cluster.
  if (cal.a2a_bytes_per_s > 0 && c.num_nodes() == 1) place.a2a_link = LinkSpec{cal.a2a_bytes_per_s, cal.a2a_latency_s};
  if (cal.p2p_latency_s > 0) {
    auto same_node = [&](const std::vector<int>& other) {
      bool same = true;
      for (int r : other) same = same && c.node_of(r) == c.node_of(ranks[0]);
      return same && one_node;
    };
    if (place.has_prev && same_node(prev)) place.prev_link.latency_s = cal.p2p_latency_s;
    if (place.has_next && same_node(next)) place.next_link.latency_s = cal.p2p_latency_s;
  }
}

double pipeline_1f1b_s(const std::vector<double>& stage_times, int64_t m) {
  double sum = 0, mx = 0;
  for (double t : stage_times) sum += t, mx = std::max(mx, t);
  return sum + static_cast<double>(m - 1) * mx;
}

}  // namespace ckpt::trainer
