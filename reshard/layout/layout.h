// Layout: how a model is split over ranks. Two forms of one idea:
// - symmetric (pipelines empty): tp, pp, dp, the pipeline stage of every layer (uneven splits
//   allowed), ZeRO stage, per-DP-rank micro-batch sizes. Rank = (pp_rank * dp + dp_rank) * tp +
//   tp_rank (Megatron-LM).
// - general (pipelines non-empty; tp = pp = dp = 0, stage_of_layer empty): a list of pipelines
//   (data-parallel replicas), each with its micro-batch size and its stages; each stage holds the
//   next `layers` layers at its own tensor-parallel size on its device type. FlagScale's process
//   meshes (consecutive stages sharing tp and device type) and FlashFlex's asymmetric pipelines are
//   both of this form. Ranks are numbered by the same rule: stage index slowest, then pipeline,
//   then tp rank (for s = 0, 1, ...: for every pipeline that has a stage s: its tp ranks), so a
//   symmetric layout written in the general form gets the same ranks. A stage may give its own
//   expert parallelism (ep, etp: StageSpec); its view places the experts by the symmetric rules.
// from_pipelines() returns the symmetric form whenever the pipelines are symmetric (same split,
// one tp, ep and etp everywhere) and name no device type, so each layout has one canonical form; the
// accessors below (num_pipelines, stage_tp, rank_of, place_of_rank, stage_view...) answer for
// both forms and are what layout-generic code uses. Code that only handles the symmetric case
// (e.g. the Megatron export) asks as_symmetric().
// Plain value type; thread safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/base/status.h"

namespace ckpt {

struct StageSpec {
  int layers = 1;        // consecutive layers after the previous stage's
  int tp = 1;            // tensor-parallel size of this stage
  std::string device;    // device type name (cluster file); "" = not named
  // Expert parallelism of this stage's MoE layers (docs/MOE.md "General layouts"): the stage view's
  // ep and etp (Layout::stage_view). etp 0 = tp; from_pipelines stores etp == tp as 0.
  int ep = 1;
  int etp = 0;
  int expert_tp() const { return etp > 0 ? etp : tp; }
  bool operator==(const StageSpec&) const = default;
};

struct PipelineSpec {
  int micro_batch = 1;             // sequences per micro-batch of this pipeline
  std::vector<StageSpec> stages;   // in pipeline order
  bool operator==(const PipelineSpec&) const = default;
};

// Where a rank sits in a layout.
struct RankPlace {
  int pipeline = 0;  // = dp rank in the symmetric form
  int stage = 0;     // = pp rank
  int tp_rank = 0;
  bool operator==(const RankPlace&) const = default;
};

struct Layout {
  int tp = 1;
  int pp = 1;
  int dp = 1;
  int zero = 0;                          // 0: optimizer state replicated over DP; 1: ZeRO-1 flat shards
  std::vector<int> stage_of_layer;       // size = num_layers; non-decreasing, every stage non-empty
  std::vector<int> micro_batch;          // size = dp (heterogeneous DP); empty = all 1
  int64_t vocab_divisor = 128;           // Megatron make-vocab-size-divisible-by (padding = divisor*tp)
  std::string profile = "reference";     // vendor profile name
  std::vector<PipelineSpec> pipelines;   // the general form (see the top of this file); empty: symmetric
  // Expert parallelism (MoE layers; docs/MOE.md): the tp x dp ranks of a stage regrouped for the
  // experts as etp x ep x edp in Megatron-Core's order (etp fastest, then ep). ep = 1 and etp = 0
  // (= tp): experts split as a dense MLP. Symmetric form; the general form gives them per stage
  // (StageSpec::ep, etp; here 1 and 0) and each stage view carries its stage's.
  int ep = 1;
  int etp = 0;
  // Set by place_in_layout on the view it gives ShardingRules::place: the view's DP rank the boxes
  // are asked for (the pipeline; 0 in a view of non-uniform pipelines, whose dp is 1), when they
  // depend on it (expert parallelism); -1 otherwise. Not stored.
  int view_pipeline = -1;

  bool symmetric() const { return pipelines.empty(); }
  int expert_tp() const { return etp > 0 ? etp : tp; }
  // True when expert tensors are not placed as dense ones (ep > 1 or etp != tp): their boxes then
  // differ between the DP ranks of a stage. General form: when some stage is.
  bool expert_parallel() const;
  // The expert coordinates of stage-local rank r = pipeline * tp + tp_rank (symmetric form):
  // expert TP rank r % etp, expert-parallel rank (r / etp) % ep, expert data-parallel rank
  // r / (etp * ep) (Megatron-Core's order). The one definition of the store's expert boxes and
  // the trainer's expert groups.
  struct ExpertCoord {
    int etp = 0, ep = 0, edp = 0;
  };
  ExpertCoord expert_coord(int pipeline, int tp_rank) const {
    const int r = pipeline * tp + tp_rank, e = expert_tp();
    return {r % e, (r / e) % ep, r / (e * ep)};
  }

  // ---- for both forms ----
  int num_pipelines() const;
  int num_stages(int pipeline) const;
  int max_stages() const;                     // the most stages of any pipeline
  int stage_tp(int pipeline, int stage) const;
  int stage_ep(int pipeline, int stage) const;
  int stage_expert_tp(int pipeline, int stage) const;  // etp (= tp when not given)
  int stage_layers(int pipeline, int stage) const;
  int stage_first_layer(int pipeline, int stage) const;
  std::string stage_device(int pipeline, int stage) const;
  int stage_of(int pipeline, int layer) const;  // the stage of `pipeline` holding `layer`
  int pipeline_micro_batch(int pipeline) const;
  int num_layers() const;
  int world_size() const;
  // Rank of (pipeline stage, pipeline = DP rank, TP rank); the argument order is the symmetric
  // form's (pp_rank, dp_rank, tp_rank).
  int rank_of(int stage, int pipeline, int tp_rank) const;
  RankPlace place_of_rank(int rank) const;  // rank in [0, world_size())
  // Every pipeline holds the same layers at the same tp, ep and etp on each stage (device types
  // and micro-batch sizes may differ): then stage s's TP rank t of every pipeline hold the same
  // dense parameters and form a data-parallel group, as ZeRO-1 needs, and the stage's ranks of
  // every pipeline share its experts.
  bool uniform_pipelines() const;
  // The symmetric layout that places tensors for stage `stage` of `pipeline`: tp, ep and etp = that
  // stage's, pp and stage_of_layer from that pipeline's split, dp = num_pipelines() when
  // uniform_pipelines() (with every pipeline's micro-batch), else 1; zero, vocab_divisor and
  // profile kept. For a symmetric layout: *this.
  Layout stage_view(int pipeline, int stage) const;
  // The symmetric form of this layout (device names dropped), or Unsupported naming `what` needs it.
  Result<Layout> as_symmetric(const std::string& what) const;
  // Sets every pipeline's micro-batch size (size num_pipelines()).
  void set_micro_batches(const std::vector<int>& mbs);

  // ---- symmetric form ----
  // First layer and number of layers of stage s (symmetric form; general form: of pipeline 0).
  int first_layer(int stage) const;
  int layers_in_stage(int stage) const;
  // Padded vocabulary for this layout: ceil(V / (vocab_divisor * tp)) * vocab_divisor * tp
  // (symmetric form; for the general form ask stage_view(p, s).padded_vocab).
  int64_t padded_vocab(int64_t vocab_size) const;

  // Even split of `num_layers` over `pp` stages (earlier stages take the remainder), or the
  // given per-stage layer counts.
  static Result<Layout> make(int tp, int pp, int dp, int zero, int num_layers,
                             const std::vector<int>& layers_per_stage = {});
  // The general form from pipelines (validated); the symmetric form when they are symmetric and
  // name no device.
  static Result<Layout> from_pipelines(std::vector<PipelineSpec> pipelines, int zero, int64_t vocab_divisor = 128,
                                       const std::string& profile = "reference");
  // Structural checks that need no model knowledge (sizes positive, every stage non-empty and
  // contiguous, every pipeline covering the same layers, micro_batch size, zero in {0,1} and
  // zero 1 only over uniform pipelines, world size within int). Model checks live in ShardingRules.
  Status validate() const;
  // Symmetric: {"tp":..,"pp":..,"dp":..,"zero":..,"layers_per_stage":[..],...} (as format v1), and
  // "ep", "etp" when expert parallel.
  // General: {"pipelines":[{"micro_batch":m,"stages":[{"layers":n,"tp":t,"device":"X"},..]},..],
  //           (a stage's "ep", "etp" when expert parallel)
  //           "zero":..,"num_layers":..,"vocab_divisor":..,"profile":..,"rank_order":"tp-dp-pp"}.
  nlohmann::json to_json() const;
  // Either form (a "pipelines" key selects the general one); FlagScale-style keys
  // (hetero_process_meshes...) are read by from_flagscale (reshard/layout/layout_flagscale.h).
  static Result<Layout> from_json(const nlohmann::json& j);
  // A layout file (`ckpt reshard --layout FILE`): read_json_file with kLayoutJsonLimits (JSON
  // rules: kCorruption), then from_json (BadLayout); errors carry the file.
  static Result<Layout> from_file(const std::string& path);
  // For a layout made from flags: takes vocab_divisor and profile from the source checkpoint's
  // layout JSON `src` where it names valid ones (flags do not set them).
  void keep_source_settings(const nlohmann::json& src);
  // "tp=2 pp=3 [2,3,3] dp=1 zero=1"; general: "2 pipelines: mb=3 [1 tp2 ep2 A | 2 tp1 B], mb=1 [...] zero=0"
  // (a stage's "epE" and "etpX" when expert parallel, etp only when != tp)
  std::string to_string() const;
};

}  // namespace ckpt
