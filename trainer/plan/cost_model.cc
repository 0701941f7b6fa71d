// evaluate() of the planner's cost model (trainer/plan/cost_model.h; docs/PLAN.md).
#include "trainer/plan/cost_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "trainer/memory_estimate.h"

namespace ckpt::trainer {

namespace {

Status plan_bad(const std::string& msg) { return Status::Error("BadPlan", msg); }

std::string plan_gib(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / 1073741824.0);
  return buf;
}

// What every stage of one evaluation shares: the layout's first ranks, the layout ranks per node,
// the data-parallel links of stage indices every pipeline has (the same group for all pipelines),
// and the embedded trainer's estimate per rank (memory model embedded).
struct CostContext {
  std::vector<std::vector<int>> first;  // [p][s]: layout rank of TP rank 0
  std::vector<int> on_node;
  std::map<int, LinkSpec> dp_link;       // stage index -> link (stage indices below every pipeline's count)
  std::vector<RankMemory> trainer;       // per layout rank (embedded)
};

// The ranks of stage s of pipeline p on the cluster (placement applied).
std::vector<int> cost_stage_ranks(const Layout& l, const CostContext& cx, const std::vector<int>& place, int p, int s) {
  std::vector<int> r;
  const int f = cx.first[static_cast<size_t>(p)][static_cast<size_t>(s)];
  for (int j = 0; j < l.stage_tp(p, s); ++j) r.push_back(place[static_cast<size_t>(f + j)]);
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
std::vector<int> cost_replicas(const Layout& l, const CostContext& cx, const std::vector<int>& place, int p, int s) {
  std::vector<int> g;
  if (l.num_pipelines() < 2) return g;
  auto first = [&](int q, int k) { return place[static_cast<size_t>(cx.first[static_cast<size_t>(q)][static_cast<size_t>(k)])]; };
  g.push_back(first(p, s));
  for (int q = 0; q < l.num_pipelines(); ++q)
    if (q != p) g.push_back(first(q, std::min(s, l.num_stages(q) - 1)));
  return g;
}

// The stage's data-parallel link (slowest_link_of its replicas), shared by the pipelines when every
// pipeline has the stage index (then the group is the same set for all).
LinkSpec cost_dp_link(const Cluster& cluster, const Layout& l, CostContext& cx, const std::vector<int>& place, int p, int s) {
  int shortest = l.num_stages(0);
  for (int q = 1; q < l.num_pipelines(); ++q) shortest = std::min(shortest, l.num_stages(q));
  if (s < shortest) {
    auto it = cx.dp_link.find(s);
    if (it != cx.dp_link.end()) return it->second;
  }
  const LinkSpec link = slowest_link_of(cluster, cost_replicas(l, cx, place, p, s));
  if (s < shortest) cx.dp_link[s] = link;
  return link;
}

// The stage's memory as the embedded trainer estimates it: its largest rank.
void cost_trainer_memory(StageCost& c, const CostContext& cx, int first_rank) {
  const RankMemory* w = nullptr;
  for (int j = 0; j < c.tp; ++j) {
    const RankMemory& m = cx.trainer[static_cast<size_t>(first_rank + j)];
    if (!w || m.total() > w->total()) w = &m;
  }
  c.weights = w->weights, c.grads = w->grads, c.optimizer = w->optimizer, c.activations = w->activations;
  c.other = w->workspace + w->buffers + w->checkpoint + w->process;
}

// Stage st of pipeline p; its problems appended to `out`.
StageCost cost_one_stage(const ModelSpec& model, const Cluster& cluster, const Layout& layout, const std::vector<int>& place,
                         int p, int st, int64_t m, const PlanOptions& opt, int zero_ways, CostContext& cx, PlanCost& out) {
  const int S = layout.num_stages(p), P = layout.num_pipelines();
  const int64_t s = opt.seq_len;
  const std::vector<int> ranks = cost_stage_ranks(layout, cx, place, p, st);
  const std::vector<int> prev = st > 0 ? cost_stage_ranks(layout, cx, place, p, st - 1) : std::vector<int>{};
  const std::vector<int> next = st + 1 < S ? cost_stage_ranks(layout, cx, place, p, st + 1) : std::vector<int>{};
  StagePlace sp = make_stage_place(cluster, ranks, prev, next, {});
  if (P > 1) sp.dp_link = cost_dp_link(cluster, layout, cx, place, p, st);
  apply_calibration(sp, cluster, ranks, cx.on_node, opt.calibration, prev, next);
  const StageShape shape{layout.stage_layers(p, st), layout.stage_tp(p, st), st == 0, st == S - 1, layout.ep, layout.etp};
  StageCost c = stage_cost(model, sp, shape, layout.pipeline_micro_batch(p), s, m, st, S, P, zero_ways);
  if (!cx.trainer.empty()) cost_trainer_memory(c, cx, cx.first[static_cast<size_t>(p)][static_cast<size_t>(st)]);
  c.pipeline = p;
  c.first_layer = layout.stage_first_layer(p, st);
  if (!model.tp_divides(c.tp)) {
    out.feasible = false;
    out.problems.push_back("pipeline " + std::to_string(p) + " stage " + std::to_string(st) + ": tp " + std::to_string(c.tp) +
                           " does not divide the heads (" + std::to_string(model.heads) + "), kv heads (" +
                           std::to_string(model.kv_heads) + ") and ffn (" + std::to_string(model.ffn) +
                           (model.moe() ? ", experts' " + std::to_string(model.expert_ffn) + ", shared " + std::to_string(model.shared_ffn)
                                        : std::string()) +
                           ")");
  }
  if (layout.expert_parallel() && !model.ep_fits(layout.ep, shape.expert_tp(), c.tp, P)) {
    out.feasible = false;
    out.problems.push_back("pipeline " + std::to_string(p) + " stage " + std::to_string(st) + ": ep " + std::to_string(layout.ep) +
                           " x etp " + std::to_string(shape.expert_tp()) + " does not fit " + std::to_string(model.experts) +
                           " experts of width " + std::to_string(model.expert_ffn) + " on tp " + std::to_string(c.tp) + " x " +
                           std::to_string(P) + " replicas");
  }
  if (c.memory() > c.capacity) {
    out.feasible = false;
    out.problems.push_back("pipeline " + std::to_string(p) + " stage " + std::to_string(st) + " (" + std::to_string(c.layers) +
                           " layers, tp " + std::to_string(c.tp) + ") on '" + c.device + "' needs " +
                           plan_gib(static_cast<double>(c.memory())) + " per rank but the device has " +
                           plan_gib(static_cast<double>(c.capacity)) + ": over by " +
                           plan_gib(static_cast<double>(c.memory() - c.capacity)) +
                           (c.other ? " (memory model embedded; workspace, buffers, checkpoint staging and the process constant " +
                                          plan_gib(static_cast<double>(c.other)) + " of it)"
                                    : std::string()));
  }
  return c;
}

// Every rank's memory and compute share; returns the sum of the used devices' peak FLOP/s.
double cost_ranks(const Cluster& cluster, const Layout& layout, const std::vector<int>& place, int64_t m, const CostContext& cx,
                  PlanCost& out) {
  double peak = 0;
  out.ranks.resize(static_cast<size_t>(layout.world_size()));
  for (const StageCost& c : out.stages) {  // pipeline by pipeline, stage by stage
    const int f = cx.first[static_cast<size_t>(c.pipeline)][static_cast<size_t>(c.stage)];
    for (int j = 0; j < c.tp; ++j) {
      const int r = f + j, cr = place[static_cast<size_t>(r)];
      RankCost& rc = out.ranks[static_cast<size_t>(r)];
      rc.rank = r, rc.cluster_rank = cr, rc.pipeline = c.pipeline, rc.stage = c.stage;
      rc.node = cluster.nodes.empty() ? "node0" : cluster.nodes[static_cast<size_t>(cluster.node_of(cr))].name;
      rc.device = cluster.device_of(cr).name;
      rc.memory = cx.trainer.empty() ? c.memory() : cx.trainer[static_cast<size_t>(r)].total();
      rc.capacity = cluster.device_of(cr).memory_bytes;
      peak += cluster.device_of(cr).peak_flops;
      rc.compute_fraction = out.step_time_s > 0 ? static_cast<double>(m) * c.flops / (cluster.device_of(cr).peak_flops * out.step_time_s) : 0;
    }
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
  CostContext cx;
  cx.first = layout_first_ranks(layout);
  cx.on_node = ranks_per_node(cluster, place);
  out.memory_model = memory_model_name(opt.memory_model);
  out.ep = layout.ep, out.etp = layout.symmetric() ? layout.expert_tp() : layout.stage_tp(0, 0);
  if (opt.memory_model == MemoryModel::kEmbedded) {  // the trainer's own estimate (trainer/memory_estimate.h)
    if (!opt.config) return plan_bad("the embedded memory model needs the model's config");
    MemoryInputs mi;
    mi.config = *opt.config, mi.layout = layout, mi.seq_len = opt.seq_len, mi.grad_accum = m;
    mi.checkpoints = true, mi.mpi = layout.world_size() > 1;
    auto est = estimate_memory(mi);
    if (est.ok()) {
      cx.trainer = std::move(est).value();
    } else {  // a layout the trainer refuses (tp not dividing the heads...): the formula's memory, named
      out.feasible = false;
      out.problems.push_back("the embedded trainer's memory estimate: " + est.status().message());
    }
  }
  for (int p = 0; p < P; ++p) {
    const int S = layout.num_stages(p);
    const int64_t b = layout.pipeline_micro_batch(p);
    PipelineCost pc;
    pc.micro_batch = static_cast<int>(b);
    pc.micro_batches = m;
    pc.stages = S;
    std::vector<double> times;
    double after = 0;  // the largest stage's gradient sync + optimizer update
    for (int st = 0; st < S; ++st) {
      StageCost c = cost_one_stage(model, cluster, layout, place, p, st, m, opt, zero_ways, cx, out);
      times.push_back(c.time_s());
      pc.dp_sync_s = std::max(pc.dp_sync_s, c.dp_sync_s);
      pc.update_s = std::max(pc.update_s, c.update_s);
      after = std::max(after, c.after_s());
      out.a2a_s_per_step = std::max(out.a2a_s_per_step, static_cast<double>(m) * c.a2a_trainer_s);
      out.stages.push_back(std::move(c));
    }
    const double compute = pipeline_1f1b_s(times, m);
    pc.bubble_s = compute - static_cast<double>(m) * *std::max_element(times.begin(), times.end());
    pc.time_s = compute + after;
    out.step_time_s = std::max(out.step_time_s, pc.time_s);
    out.pipelines.push_back(pc);
  }
  out.flops_per_step = model.step_flops(opt.global_batch, opt.seq_len);
  out.tokens_per_s = out.step_time_s > 0 ? static_cast<double>(opt.global_batch * opt.seq_len) / out.step_time_s : 0;
  const double peak = cost_ranks(cluster, layout, place, m, cx, out);
  out.mfu = out.step_time_s > 0 ? out.flops_per_step / (peak * out.step_time_s) : 0;
  return out;
}

}  // namespace ckpt::trainer
