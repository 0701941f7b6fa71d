// The planner's cost model (docs/PLAN.md has every formula): the time of one optimizer step and the
// memory of every rank for a LLaMA model, a cluster (reshard/dist/cluster.h: device types with peak
// FLOP/s, efficiency, memory, dtype; nodes and links) and a layout (reshard/layout/layout.h) mapped onto
// the cluster's devices (a placement). Terms:
// - compute: per layer forward FLOPs (GQA projections, score and probability-value matmuls,
//   SwiGLU MLP), the LM head; backward = 2 x forward; divided by tp; at peak_flops * efficiency;
// - tensor parallel: 4 ring all-reduces of the [b*s, D] activation per layer (2 forward, 2
//   backward), one for the embedding (first stage) and one for the head's input gradient (last),
//   over the slowest link the TP group spans;
// - pipeline: the [b*s, D] activation sent forward and its gradient backward at every boundary;
// - a pipeline's time under 1F1B: the sum of its stage times (one micro-batch through every stage)
//   + (m - 1) * the largest stage time, plus the data-parallel gradient all-reduce (or ZeRO-1
//   reduce-scatter + all-gather, the same bytes) of its largest stage; the step's time is the
//   slowest pipeline's;
// - calibrated terms of the software stack (CostCalibration, measured by `ckpt plan --calibrate`):
//   the FLOP/s a process keeps when N ranks of the layout compute on its node at once (timeshared
//   beyond the machine's cores), the per-call cost of the TP all-reduce inside a node, a fixed cost
//   per micro-batch and stage, the gradient syncs' all-reduce at MB sizes, the optimizer update per
//   parameter (once per step after the sync: the largest stage's sync + update ends the step);
// - memory per rank: weights and gradients in the device type's dtype, Adam state (fp32 master +
//   two moments; no master copy when the dtype is fp32), divided over the replicas under ZeRO-1,
//   activations of the micro-batches in flight under 1F1B (min(S - s, m) on stage s).
// Pure functions over values; thread safe.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "converters/model/llama_config.h"
#include "formats/base/status.h"
#include "reshard/dist/cluster.h"
#include "reshard/layout/layout.h"
#include "trainer/plan/memory_model.h"

namespace ckpt::trainer {

struct ModelSpec {
  int64_t layers = 1, hidden = 1, ffn = 1, heads = 1, kv_heads = 1, head_dim = 1, vocab = 1;
  bool tied = false;
  // MoE (docs/PLAN.md "Mixture of experts"): E experts of width expert_ffn, top_k per token, a
  // shared expert of width shared_ffn (0: none), in moe_layers of the layers (the others dense of
  // width ffn). The per-layer terms below are the average over the layers (exact when every layer
  // is MoE, as in Mixtral and Qwen3-MoE).
  int64_t experts = 0, top_k = 0, expert_ffn = 0, shared_ffn = 0, moe_layers = 0;
  // Routing imbalance assumed (`ckpt plan --router-load X`): the most loaded expert's tokens over the
  // mean (the trainer's router_load, max / mean); 1: balanced. Under ep > 1 the busiest EP rank
  // computes, sends and receives min(router_load, ep) x its balanced share of the routed rows.
  double router_load = 1;
  double expert_load(int ep) const { return ep > 1 ? std::min(router_load, static_cast<double>(ep)) : 1.0; }
  static ModelSpec from_config(const LlamaConfig& c);
  bool moe() const { return experts > 0 && moe_layers > 0; }
  // Parameters of one decoder layer split by TP (q, k, v, o, the dense MLP or the shared expert),
  // replicated (2 norms, the router) and of the routed experts (split over ep x etp).
  int64_t layer_split_params() const;
  int64_t layer_norm_params() const;
  int64_t layer_expert_params() const;
  int64_t total_params() const;
  // A tp the model's tensors split by: heads, kv heads, every MLP width.
  bool tp_divides(int tp) const;
  // An expert-parallel pair for a stage of tp ranks in `replicas` identical pipelines: ep divides
  // the experts and tp * replicas / etp, etp divides tp and the experts' width.
  bool ep_fits(int ep, int etp, int tp, int replicas) const;
  // Forward FLOPs (2 per multiply-add) of one decoder layer / of the LM head for b sequences of s tokens.
  double layer_forward_flops(int64_t b, int64_t s) const;
  double head_forward_flops(int64_t b, int64_t s) const;
  // Forward + backward FLOPs of a whole step of `sequences` sequences (3 x forward).
  double step_flops(int64_t sequences, int64_t s) const;
};

// Measured terms of one machine's training stack (`ckpt plan --calibrate` writes them under
// "cost_terms"; `ckpt plan --calibration FILE` applies them to every device type of the cluster:
// use it when the cluster runs this machine's software, e.g. emulation runs; docs/PLAN.md
// "Calibrated terms"). Default: no term (the cluster file's figures alone).
struct CostCalibration {
  // concurrency[k - 1]: the training FLOP/s of one process while k ranks compute on its node at
  // once, over its FLOP/s alone (entry 0 is 1). Nodes with more ranks than measured use the last,
  // times cores / k beyond `cores` (the processes timeshare the cores).
  std::vector<double> concurrency;
  // The TP all-reduce inside a node as one call costs between GEMMs on 2 ranks: latency + bytes /
  // bytes_per_s (fitted at the trainer's message sizes); priced with the ring formula for tp > 2.
  // bytes_per_s 0: not measured (the cluster's links).
  double allreduce_latency_s = 0, allreduce_bytes_per_s = 0;
  // Fixed seconds per micro-batch and stage (a step of tiny compute, per micro-batch and stage).
  double micro_batch_overhead_s = 0;
  // Per pipeline message inside a node (activation or its gradient), on top of bytes / bandwidth:
  // replaces the link latency of pipeline send/recv inside a node when > 0.
  double p2p_latency_s = 0;
  // The expert all-to-all inside a node (Comm::exchange over 2 ranks as the trainer's EP dispatch
  // calls it): latency + bytes / bytes_per_s per call; bytes_per_s 0: not measured (the links).
  double a2a_latency_s = 0, a2a_bytes_per_s = 0;
  // The trainer's optimizer update (gradient norm, clipping, AdamW) in parameters per second of one
  // process; 0: not measured (no update term: the calibrated efficiency then includes it).
  double update_params_per_s = 0;
  // The gradient sync's all-reduce at MB sizes (Comm::all_reduce_sum of 16 MiB over 2 ranks):
  // bytes / seconds; 0: not measured (the data-parallel link, or the TP link with one pipeline).
  double sync_bytes_per_s = 0;
  int cores = 0;  // the calibrating machine's CPUs (sched_getaffinity), for `concurrency`; 0: not recorded
  // The FLOP/s factor for `ranks_on_node` ranks computing at once (1 without measurements).
  double speed_scale(int ranks_on_node) const;
  // From a calibration file's "cost_terms" object (or the file's top level holding it). Errors
  // (BadCalibration): a key of the wrong type, a factor outside (0, 1], a negative cost.
  static Result<CostCalibration> from_json(const nlohmann::json& j);
  nlohmann::json to_json() const;
};

struct PlanOptions {
  int64_t global_batch = 1;    // sequences per optimizer step
  int64_t seq_len = 1;
  std::vector<int> placement;  // layout rank -> cluster rank; empty: assign_placement()
  CostCalibration calibration;
  MemoryModel memory_model = MemoryModel::kMegatron;  // memory_model.h
  const LlamaConfig* config = nullptr;                // kEmbedded: the model's config (the trainer's estimate needs it)
};

// What one stage of one pipeline costs per micro-batch (forward + backward), per rank.
struct StageCost {
  int pipeline = 0, stage = 0, first_layer = 0, layers = 0, tp = 1;
  std::string device;
  double flops = 0;        // per rank per micro-batch
  int ep = 1, etp = 1;
  double compute_s = 0, tp_comm_s = 0, p2p_s = 0, overhead_s = 0, dp_sync_s = 0, a2a_s = 0;
  // update_s: the optimizer update of the parameters the rank updates, once per step after dp_sync_s.
  // a2a_trainer_s: per micro-batch what `ckpt train`'s a2a_s counts (the all-to-alls, the ETP
  // gather / scatter counted in tp_comm_s, the wait for the busiest EP rank counted in its compute).
  double update_s = 0, a2a_trainer_s = 0;
  double time_s() const { return compute_s + tp_comm_s + p2p_s + overhead_s + a2a_s; }
  double after_s() const { return dp_sync_s + update_s; }  // once per step, after the micro-batches
  // other: the embedded trainer's workspace, buffers, checkpoint staging and process constant (0
  // under the megatron memory model).
  uint64_t weights = 0, grads = 0, optimizer = 0, activations = 0, other = 0, capacity = 0;
  uint64_t memory() const { return weights + grads + optimizer + activations + other; }
};

struct PipelineCost {
  int micro_batch = 1;
  int64_t micro_batches = 1;
  int stages = 1;
  double time_s = 0;        // sum of stage times + (m - 1) * max stage time + the largest stage's after_s()
  double bubble_s = 0;      // sum of stage times - max stage time
  double dp_sync_s = 0;     // the largest stage's gradient sync
  double update_s = 0;      // the largest stage's optimizer update
};

struct RankCost {
  int rank = 0, cluster_rank = 0, pipeline = 0, stage = 0;
  std::string node, device;
  uint64_t memory = 0, capacity = 0;
  double compute_fraction = 0;  // FLOPs this rank does in a step / (peak_flops * step time)
};

struct PlanCost {
  bool feasible = true;
  std::vector<std::string> problems;  // what does not fit, by how much
  double step_time_s = 0, tokens_per_s = 0, flops_per_step = 0, mfu = 0;
  int64_t global_batch = 0, seq_len = 0;
  std::string memory_model = "megatron";  // memory_model_name of the model the memory terms follow
  int ep = 1, etp = 1;                     // the layout's expert parallelism (etp: Layout::expert_tp)
  // The largest m x a2a_trainer_s of a stage: one rank's all-to-all time per step as `ckpt train`
  // measures it (its a2a_s: the busiest rank's wait and the ETP collectives included).
  double a2a_s_per_step = 0;
  std::vector<StageCost> stages;      // pipeline by pipeline, stage by stage
  std::vector<PipelineCost> pipelines;
  std::vector<RankCost> ranks;        // layout rank order
  nlohmann::json to_json() const;
  std::string to_text() const;
};

// Layout::to_string with runs of identical consecutive pipelines written once as "64 x mb=1 [...]"
// (a symmetric layout: to_string).
std::string layout_text(const Layout& l);

// Bytes per element of a device type's dtype (bf16/fp16 2, fp32 4).
int dtype_bytes_of(const DeviceType& d);

// ---- per-stage terms (shared by evaluate and the search; docs/PLAN.md) ----
struct StageShape {
  int layers = 1, tp = 1;
  bool first = false, last = false;
  int ep = 1, etp = 0;  // expert parallelism (etp 0: = tp); Layout::ep / etp
  int expert_tp() const { return etp > 0 ? etp : tp; }
};
// Parameters held by one TP rank of a stage.
int64_t stage_rank_params(const ModelSpec& m, const StageShape& st);
// Parameters whose optimizer update one TP rank of a stage runs: its parameters, under ZeRO-1 the
// dense ones over zero_ways and the experts' over their ZeRO-1 group (stage_rank_memory's shares).
int64_t stage_rank_updated_params(const ModelSpec& m, const StageShape& st, int zero_ways);
// Forward + backward FLOPs of one TP rank of a stage for one micro-batch of b sequences.
double stage_rank_flops(const ModelSpec& m, const StageShape& st, int64_t b, int64_t s);
// Ring all-reduce of `bytes` over n ranks on `link`: 2(n-1)/n * bytes / bw + 2(n-1) * latency.
double ring_allreduce_s(double bytes, int n, const LinkSpec& link);
// The TP all-reduces of a stage for one micro-batch (forward + backward); with ep > 1 and etp > 1
// also the ETP all-gather and reduce-scatter of the routed rows (b s k etp / tp rows of D, forward
// and backward: 4 per MoE layer, each half a ring all-reduce over etp on `link`).
double stage_tp_comm_s(const ModelSpec& m, const StageShape& st, int64_t b, int64_t s, int act_bytes, const LinkSpec& link);
// The ETP part of stage_tp_comm_s alone (0 unless ep > 1 and etp > 1).
double stage_etp_comm_s(const ModelSpec& m, const StageShape& st, int64_t b, int64_t s, int act_bytes, const LinkSpec& link);
// The expert all-to-alls of a stage for one micro-batch (docs/PLAN.md "Mixture of experts"): per
// MoE layer 4 (dispatch and combine, forward and backward), each rank sending
// (b s / tp) * top_k * D * act_bytes * (ep - 1) / ep bytes, `bytes / bw + (ep - 1) latency` each on
// `link`; 0 at ep 1 or for a dense model.
double stage_a2a_bytes(const ModelSpec& m, const StageShape& st, int64_t b, int64_t s, int act_bytes);
double stage_a2a_s(const ModelSpec& m, const StageShape& st, int64_t b, int64_t s, int act_bytes, const LinkSpec& link);
// Memory of one TP rank of stage `stage` of `stages` (slots = min(stages - stage, micro_batches)).
struct MemoryTerms {
  uint64_t weights = 0, grads = 0, optimizer = 0, activations = 0;
  uint64_t total() const { return weights + grads + optimizer + activations; }
};
// Under ZeRO-1 the dense optimizer state is divided over zero_ways, the experts' over the expert
// data-parallel group tp * zero_ways / (ep * etp).
MemoryTerms stage_rank_memory(const ModelSpec& m, const StageShape& st, int64_t b, int64_t s, int dtype_bytes,
                              int64_t slots, int zero_ways);

// Where a stage sits, what the cost terms need from the cluster: the slowest device of its ranks
// (lowest peak_flops * efficiency), the least memory, and the links its traffic crosses; with a
// calibration (apply_calibration) the speed factor of its node's concurrency, the fixed cost per
// micro-batch, and the TP link priced as the measured all-reduce.
struct StagePlace {
  const DeviceType* device = nullptr;
  uint64_t capacity = 0;
  LinkSpec tp_link, prev_link, next_link, dp_link;
  // The expert all-to-all's link when the EP group is inside the TP group's node and a calibration
  // measured it (a2a_bytes_per_s > 0); else the slower of tp_link and dp_link.
  LinkSpec a2a_link;
  bool has_prev = false, has_next = false;
  double speed_scale = 1, micro_batch_overhead_s = 0;
  double update_params_per_s = 0;  // CostCalibration::update_params_per_s (0: no update term)
  // The gradient syncs' link when a calibration measured it on a one-node cluster (bytes_per_s 0: none).
  LinkSpec sync_link{0, 0};
  double speed() const { return device->peak_flops * Cluster::efficiency_of(*device) * speed_scale; }
};
// ranks: the stage's cluster ranks (tp order); prev / next: the neighbouring stages' (empty at the
// ends); replicas: the data-parallel group of the stage's first rank (empty without replicas).
StagePlace make_stage_place(const Cluster& c, const std::vector<int>& ranks, const std::vector<int>& prev,
                            const std::vector<int>& next, const std::vector<int>& replicas);
// The calibration's terms for a stage on `ranks` (tp order) when ranks_on_node[node] layout ranks
// run on each node: speed_scale = the lowest concurrency factor of its ranks' nodes; the TP link
// {allreduce_bytes_per_s, allreduce_latency_s / 2} (the ring formula at tp 2 is then exactly the
// measured per-call cost) when the group is inside one node; sync_link {sync_bytes_per_s,
// allreduce_latency_s / 2} for the gradient syncs on a one-node cluster; the pipeline links' latency
// p2p_latency_s when given and the neighbour is on the same node; the optimizer update's rate.
void apply_calibration(StagePlace& place, const Cluster& c, const std::vector<int>& ranks, const std::vector<int>& ranks_on_node,
                       const CostCalibration& cal, const std::vector<int>& prev, const std::vector<int>& next);
// Layout ranks per node of `c` for the cluster ranks `used`.
std::vector<int> ranks_per_node(const Cluster& c, const std::vector<int>& used);
// The 1F1B time of a pipeline from its stage times: sum + (m - 1) * max.
double pipeline_1f1b_s(const std::vector<double>& stage_times, int64_t m);

// Every term of one stage (stage `stage` of `stages`, m micro-batches of b sequences, `pipelines`
// replicas, ZeRO-1 over `zero_ways`). pipeline / first_layer are left 0. Memory: the formula
// (stage_rank_memory), or with `embedded` the embedded trainer's estimate (memory_model.h).
StageCost stage_cost(const ModelSpec& model, const StagePlace& place, const StageShape& shape, int64_t b, int64_t s,
                     int64_t m, int stage, int stages, int pipelines, int zero_ways, EmbeddedStageMemory* embedded = nullptr);

// Cluster::slowest_link(ranks) in O(n log n) (the same link: the pairs' links only depend on their
// nodes and device types; the cluster method compares every pair of distinct (node, type)).
LinkSpec slowest_link_of(const Cluster& c, const std::vector<int>& ranks);
// Layout::rank_of(s, p, 0) for every pipeline p and stage s ([p][s]) in O(ranks) (rank_of of a
// general layout walks the pipelines: quadratic over a whole layout).
std::vector<std::vector<int>> layout_first_ranks(const Layout& l);

// The cluster rank of every layout rank: the identity when the layout covers the cluster and names
// matching device types (check_cluster_layout), else every TP group (stage by stage, pipeline by
// pipeline) on devices of its stage's type, inside one node where one has enough free ones.
// Errors: ClusterMismatch naming the type that runs out (needed vs available).
Result<std::vector<int>> assign_placement(const Cluster& cluster, const Layout& layout);

// The prediction for `layout` on `cluster`. Errors: the layout's (validate), a placement of the
// wrong size or naming a rank twice, micro-batches not dividing the global batch (BadPlan). A
// layout that is valid but does not fit (memory, tp not dividing the heads) gives feasible = false
// with the problems named.
Result<PlanCost> evaluate(const ModelSpec& model, const Cluster& cluster, const Layout& layout, const PlanOptions& opt);

}  // namespace ckpt::trainer
