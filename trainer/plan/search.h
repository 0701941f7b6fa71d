// The planner's search (docs/PLAN.md "Search"): the layout of a model on a cluster with the least
// predicted step time (trainer/plan/cost_model.h) under every device's memory.
// The space: a tensor-parallel size per device type (dividing the heads, kv heads and ffn, and each
// node's count of that type, so TP groups stay inside a node; groups across nodes only when nothing
// fits otherwise); every TP group is one pipeline stage; the groups arranged into pipelines
// (data-parallel replicas), each an ordered list of stages; per pipeline a stage split and a
// micro-batch size b_p; one number m of micro-batches per pipeline (sum_p b_p * m = global batch,
// as the trainer runs); ZeRO-1 on or off (on only when every pipeline has the same stages, which
// then share one split). Every device is used.
// Enumeration: with at most `exhaustive_groups` TP groups every arrangement of groups into ordered
// pipelines (groups of one type on one node are interchangeable); above, pipelines of equal
// composition (the same number of groups of each type, types in blocks in every order). For each
// arrangement and m: splits by best_split (exact), micro-batch sizes by the min-max allocation
// (T_p(b) is non-decreasing in b: bisection on the step time, exact), ZeRO-1's shared split over
// every micro-batch vector (small) or the ZeRO-0 vector (large). Arrangements are visited in order
// of a lower bound (compute at full speed with the 1F1B fill, docs/PLAN.md) and the search stops
// when the bound reaches the K-th best step time found (admissible: it never exceeds the true value;
// the calibrated terms only add time, except the concurrency factor, which the bound applies).
// At scale (docs/PLAN.md "Search at scale"): the pipelines of an arrangement with equal stage
// places form classes valued once (search_arranged.h); splits are looked for only below the K-th
// best step time; a candidate is built (layout, placement, evaluate()) only when its predicted step
// time can enter the top K. Memory: the plan's memory model (memory_model.h).
// Pure functions; thread safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/base/status.h"
#include "reshard/dist/cluster.h"
#include "reshard/layout/layout.h"
#include "trainer/plan/cost_model.h"

namespace ckpt::trainer {

struct SearchOptions {
  int64_t global_batch = 1, seq_len = 1;
  int top = 3;                 // candidates kept
  int exhaustive_groups = 6;   // enumerate every arrangement up to this many TP groups
  bool allow_zero = true;
  CostCalibration calibration;  // measured terms (cost_model.h); default none
  MemoryModel memory_model = MemoryModel::kMegatron;  // memory_model.h
  const LlamaConfig* config = nullptr;                // kEmbedded: the model's config
};

// The options evaluate() takes for a candidate of the search on `placement`.
PlanOptions plan_options_of(const SearchOptions& opt, std::vector<int> placement);

struct PlanCandidate {
  Layout layout;
  std::vector<int> placement;  // layout rank -> cluster rank
  PlanCost cost;
};

struct SearchResult {
  std::vector<PlanCandidate> best;  // by step time, at most `top`
  int64_t arrangements = 0, evaluated = 0;
  int64_t visited = 0;  // (arrangement, m) pairs valued: those whose bound is below the K-th best found
  bool exhaustive = false, cross_node_tp = false;
  double seconds = 0;
};

// Errors: PlanInfeasible when no layout of the space fits (the message names what does not fit
// and by how much: the closest layout's stages over their memory), BadPlan for inputs that do not
// go together (a device type without peak_flops, a global batch < 1).
Result<SearchResult> search_layouts(const ModelSpec& model, const Cluster& cluster, const SearchOptions& opt);

// The layout an expert writes by hand: tp = devices of a type per node (largest valid), every TP
// group one stage in the cluster's rank order, pipelines of equal composition (the fewest stages
// that fit), the even split (earlier stages take the remainder), equal micro-batches of 1, ZeRO 0.
Result<PlanCandidate> hand_written_layout(const ModelSpec& model, const Cluster& cluster, const SearchOptions& opt);

// Why `c` loses to `best` (the terms that differ most: "pipeline 0 stage 2 on B is the bottleneck:
// 0.12 s per micro-batch vs 0.08 s", "bubble", "data-parallel sync", ...).
std::string why_slower(const PlanCandidate& c, const PlanCandidate& best);

}  // namespace ckpt::trainer
