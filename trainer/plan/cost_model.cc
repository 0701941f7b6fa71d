// evaluate() of the planner's cost model (trainer/plan/cost_model.h; docs/PLAN.md).
#include "trainer/plan/cost_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

namespace ckpt::trainer {

namespace {

Status plan_bad(const std::string& msg) { return Status::Error("BadPlan", msg); }

std::string plan_gib(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / 1073741824.0);
  return buf;
}

// The ranks of stage s of pipeline p on the cluster (placement applied).
std::vector<int> cost_stage_ranks(const Layout& l, const std::vector<int>& place, int p, int s) {
  std::vector<int> r;
  for (int j = 0; j < l.stage_tp(p, s); ++j) r.push_back(place[static_cast<size_t>(l.rank_of(s, p, j))]);
  return r;
}

Status cost_check_inputs(const ModelSpec& model, const Cluster& cluster, const Layout& layout, const PlanOptions& opt,
                         const std::vector<int>& place) {
  if (layout.num_layers() != model.layers)
    return plan_bad("the layout has " + std::to_string(layout.num_layers()) + " layers, the model " + std::to_string(model.layers));
  if (place.size() != static_cast<size_t>(layout.world_size()))
    return plan_bad("the placement names " + std::to_string(place.size()) + " devices, the layout has " +
                    std::to_string(layout.world_size()) + " ranks");
  std::set<int> seen;
  for (int r : place)
    if (r < 0 || r >= cluster.world_size() || !seen.insert(r).second)
      return plan_bad("the placement names cluster rank " + std::to_string(r) + " twice or outside 0.." +
                      std::to_string(cluster.world_size() - 1));
  for (int r : place)
    if (!(cluster.device_of(r).peak_flops > 0))
      return plan_bad("device type '" + cluster.device_of(r).name + "' has no peak_flops: the cost model needs its FLOP/s");
  if (opt.global_batch < 1 || opt.seq_len < 1) return plan_bad("the global batch and the sequence length must be >= 1");
  int64_t sum_mb = 0;
  for (int p = 0; p < layout.num_pipelines(); ++p) sum_mb += layout.pipeline_micro_batch(p);
  if (opt.global_batch % sum_mb != 0)
    return plan_bad("the global batch " + std::to_string(opt.global_batch) + " is not a multiple of the pipelines' micro-batch sum " +
                    std::to_string(sum_mb) + " (every pipeline runs the same number of micro-batches)");
  return Status::Ok();
}

// The stage's data-parallel group: its first rank and, in every other pipeline, the first rank of
// the stage with the same index (its last stage when it has fewer; docs/PLAN.md "Data parallel").
std::vector<int> cost_replicas(const Layout& l, const std::vector<int>& place, int p, int s) {
  std::vector<int> g;
  if (l.num_pipelines() < 2) return g;
  g.push_back(place[static_cast<size_t>(l.rank_of(s, p, 0))]);
  for (int q = 0; q < l.num_pipelines(); ++q)
    if (q != p) g.push_back(place[static_cast<size_t>(l.rank_of(std::min(s, l.num_stages(q) - 1), q, 0))]);
  return g;
}

// Stage st of pipeline p; its problems appended to `out`.
StageCost cost_one_stage(const ModelSpec& model, const Cluster& cluster, const Layout& layout, const std::vector<int>& place,
                         int p, int st, int64_t m, const PlanOptions& opt, int zero_ways, PlanCost& out) {
  const int S = layout.num_stages(p), P = layout.num_pipelines();
  const int64_t s = opt.seq_len;
  const std::vector<int> ranks = cost_stage_ranks(layout, place, p, st);
  const std::vector<int> prev = st > 0 ? cost_stage_ranks(layout, place, p, st - 1) : std::vector<int>{};
  const std::vector<int> next = st + 1 < S ? cost_stage_ranks(layout, place, p, st + 1) : std::vector<int>{};
  StagePlace sp = make_stage_place(cluster, ranks, prev, next, cost_replicas(layout, place, p, st));
  apply_calibration(sp, cluster, ranks, ranks_per_node(cluster, place), opt.calibration, prev, next);
  const StageShape shape{layout.stage_layers(p, st), layout.stage_tp(p, st), st == 0, st == S - 1};
  StageCost c = stage_cost(model, sp, shape, layout.pipeline_micro_batch(p), s, m, st, S, P, zero_ways);
  c.pipeline = p;
  c.first_layer = layout.stage_first_layer(p, st);
  if (model.heads % c.tp || model.kv_heads % c.tp || model.ffn % c.tp) {
    out.feasible = false;
    out.problems.push_back("pipeline " + std::to_string(p) + " stage " + std::to_string(st) + ": tp " + std::to_string(c.tp) +
                           " does not divide the heads (" + std::to_string(model.heads) + "), kv heads (" +
                           std::to_string(model.kv_heads) + ") and ffn (" + std::to_string(model.ffn) + ")");
  }
  if (c.memory() > c.capacity) {
    out.feasible = false;
    out.problems.push_back("pipeline " + std::to_string(p) + " stage " + std::to_string(st) + " (" + std::to_string(c.layers) +
                           " layers, tp " + std::to_string(c.tp) + ") on '" + c.device + "' needs " +
                           plan_gib(static_cast<double>(c.memory())) + " per rank but the device has " +
                           plan_gib(static_cast<double>(c.capacity)) + ": over by " +
                           plan_gib(static_cast<double>(c.memory() - c.capacity)));
  }
  return c;
}

// Every rank's memory and compute share; returns the sum of the used devices' peak FLOP/s.
double cost_ranks(const Cluster& cluster, const Layout& layout, const std::vector<int>& place, int64_t m, PlanCost& out) {
  double peak = 0;
  for (int r = 0; r < layout.world_size(); ++r) {
    const RankPlace rp = layout.place_of_rank(r);
    const int cr = place[static_cast<size_t>(r)];
    const StageCost* c = nullptr;
    for (const StageCost& x : out.stages)
      if (x.pipeline == rp.pipeline && x.stage == rp.stage) c = &x;
    RankCost rc;
    rc.rank = r, rc.cluster_rank = cr, rc.pipeline = rp.pipeline, rc.stage = rp.stage;
    rc.node = cluster.nodes.empty() ? "node0" : cluster.nodes[static_cast<size_t>(cluster.node_of(cr))].name;
    rc.device = cluster.device_of(cr).name;
    rc.memory = c->memory();
    rc.capacity = cluster.device_of(cr).memory_bytes;
    peak += cluster.device_of(cr).peak_flops;
    rc.compute_fraction = out.step_time_s > 0 ? static_cast<double>(m) * c->flops / (cluster.device_of(cr).peak_flops * out.step_time_s) : 0;
    out.ranks.push_back(std::move(rc));
  }
  return peak;
}

}  // namespace

Result<PlanCost> evaluate(const ModelSpec& model, const Cluster& cluster, const Layout& layout, const PlanOptions& opt) {
  CKPT_RETURN_IF_ERROR(layout.validate());
  std::vector<int> place = opt.placement;
  if (place.empty()) {
    CKPT_ASSIGN_OR_RETURN(place, assign_placement(cluster, layout));
  }
  CKPT_RETURN_IF_ERROR(cost_check_inputs(model, cluster, layout, opt, place));
  PlanCost out;
  out.global_batch = opt.global_batch;
  out.seq_len = opt.seq_len;
  const int P = layout.num_pipelines();
  int64_t sum_mb = 0;
  for (int p = 0; p < P; ++p) sum_mb += layout.pipeline_micro_batch(p);
  const int64_t m = opt.global_batch / sum_mb;
  const int zero_ways = layout.zero == 1 ? P : 1;
  for (int p = 0; p < P; ++p) {
    const int S = layout.num_stages(p);
    const int64_t b = layout.pipeline_micro_batch(p);
    PipelineCost pc;
    pc.micro_batch = static_cast<int>(b);
    pc.micro_batches = m;
    pc.stages = S;
    std::vector<double> times;
    for (int st = 0; st < S; ++st) {
      StageCost c = cost_one_stage(model, cluster, layout, place, p, st, m, opt, zero_ways, out);
      times.push_back(c.time_s());
      pc.dp_sync_s = std::max(pc.dp_sync_s, c.dp_sync_s);
      out.stages.push_back(std::move(c));
    }
    const double compute = pipeline_1f1b_s(times, m);
    pc.bubble_s = compute - static_cast<double>(m) * *std::max_element(times.begin(), times.end());
    pc.time_s = compute + pc.dp_sync_s;
    out.step_time_s = std::max(out.step_time_s, pc.time_s);
    out.pipelines.push_back(pc);
  }
  out.flops_per_step = model.step_flops(opt.global_batch, opt.seq_len);
  out.tokens_per_s = out.step_time_s > 0 ? static_cast<double>(opt.global_batch * opt.seq_len) / out.step_time_s : 0;
  const double peak = cost_ranks(cluster, layout, place, m, out);
  out.mfu = out.step_time_s > 0 ? out.flops_per_step / (peak * out.step_time_s) : 0;
  return out;
}

}  // namespace ckpt::trainer
