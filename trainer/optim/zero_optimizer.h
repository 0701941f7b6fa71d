// ParallelOptimizer: AdamW for one rank of a parallel layout (either form of reshard/layout/layout.h),
// with the optimizer state either replicated over the replicas (zero 0: one slot per Param this
// rank holds, as add_param_slots) or sharded ZeRO-1 style (zero 1, uniform pipelines only: this
// pipeline's range of the stage's flat buffer, reshard/layout/zero_layout.h under the stage view
// layout.stage_view(pipeline, stage), the same definition the checkpoint store uses; one slot per
// segment part inside the range, whose Region is a flat range of the Param's TP box).
// It also owns the replica side of a step: the gradient sums (zero 0: trainer/optim/replica_sum.h over
// the world, every element summed over every (pipeline, stage) holding it, whatever their TP
// splits; zero 1: the tied embedding summed over the stages of the pipeline by the same
// ReplicaSum, then the reduce-scatter of the flat gradient buffer over the DP group into the own
// range), this rank's share of the global gradient norm (each element counted on exactly one
// rank of the world: zero 0 ReplicaSum::counted, which may be parts of a box), and, for zero 1,
// the all-gather of the updated weights back into every pipeline's Params.
// The Model must outlive the optimizer and keep its parameter buffers (they are not resized).
// Thread safety: one thread at a time; the Comm calls must come from the main thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "formats/base/status.h"
#include "formats/tensor/region.h"
#include "reshard/dist/comm.h"
#include "reshard/layout/layout.h"
#include "reshard/layout/zero_layout.h"
#include "trainer/model/model.h"
#include "trainer/optim/adamw.h"
#include "trainer/optim/held_region.h"
#include "trainer/optim/replica_sum.h"

namespace ckpt::trainer {

// A gradient this rank holds, as a region of the parameter's global tensor.
template <class T>
struct GradRegion {
  std::string tensor;  // parameter name
  Region region;       // a TP box, or (zero 1) a flat range of one
  const T* data = nullptr;  // region.numel() values in storage order
};

template <class T>
class ParallelOptimizer {
 public:
  // The optimizer of `model`, this rank's shard (stage pp_rank of pipeline dp_rank, TP rank
  // tp_rank of `layout`). `world` (size layout.world_size()): the replica sums are planned over
  // it (collective: every rank calls create with the same layout); null: a one-rank layout, or an
  // optimizer only asked for its slots and held regions (reduce_gradients and grad_sq_share then
  // fail when the layout has more than one rank). zero 1: errors when a Param is missing from the
  // stage's flat buffer or its box disagrees with the sharding rules.
  static Result<ParallelOptimizer> create(Model<T>& model, const Layout& layout, int pp_rank, int dp_rank,
                                          int tp_rank, Comm* world, const AdamWOptions& opt = {});

  BasicAdamW<T>& adam() { return adam_; }
  const BasicAdamW<T>& adam() const { return adam_; }
  int zero() const { return layout_.zero; }
  // zero 1: the flat buffer of kind optimizer.exp_avg of this rank's (stage, TP rank); its
  // exp_avg_sq twin has the same segments. zero 0: empty.
  const ZeroBuffer& flat_layout() const { return dense_.buf; }

  // Sums the Params' gradients over their replicas: zero 0 the world's ReplicaSum (every holder
  // gets the sum in Param::g; `dp` unused); zero 1 the tied embedding over the pipeline's stages,
  // then the reduce-scatter of the padded flat buffer over `dp` (the DP group, size
  // num_pipelines(); this rank's range of the sum goes to its slots; Param::g is left as it was).
  Status reduce_gradients(Comm& dp);
  // Sum of the squared reduced gradients this rank counts: every element of the world's
  // gradients once (zero 0: the parts of its boxes that no lower world rank holds; zero 1: the
  // own range, TP-replicated boxes on the lowest TP rank holding them, the tied embedding on the
  // first stage only).
  Result<double> grad_sq_share() const;
  void scale_grads(T coef) { adam_.scale_grads(coef); }
  // AdamW on this rank's slots (lr, 1-based step); zero 1: the master values are taken from the
  // Params first, and gather_params() must follow.
  void update(double lr, int64_t step);
  // zero 1: all-gather over `dp` of the updated ranges into every DP rank's Params (zero 0: no-op).
  Status gather_params(Comm& dp);
  // update() then gather_params().
  Status step(double lr, int64_t step, Comm& dp) {
    update(lr, step);
    return gather_params(dp);
  }

  // The reduced gradients (after reduce_gradients): zero 0 each Param's box, zero 1 the own range.
  std::vector<GradRegion<T>> grad_regions() const;
  // What this rank holds for a checkpoint: the weights (each Param's box) and the Adam moments
  // (optimizer.exp_avg.<p>, optimizer.exp_avg_sq.<p>: the slots' regions).
  // Float only: ParallelOptimizer<float>'s is defined (zero_optimizer.cc), <double>'s is not.
  std::vector<HeldRegion> held_regions();

 private:
  struct Part {       // zero 1: one segment of the flat buffer (a whole Param box)
    T* w = nullptr;   // the Param's values (box storage order)
    T* g = nullptr;   // the Param's gradient
    int64_t n = 0;
    int64_t flat = 0; // offset of its first element in the flat buffer
  };
  struct Whole {      // a Param held in full (its box): weights for the checkpoint, zero 0 DP sum
    std::string name;
    Region region;
    T* w = nullptr;
    T* g = nullptr;
    int64_t n = 0;
  };
  // zero 1: one flat buffer of the stage (the dense one; expert parallel: also this rank's expert
  // buffer, sharded over its expert data-parallel group, reshard/layout/zero_layout.h).
  struct Flat {
    ZeroBuffer buf;
    int d = 0;                         // this rank's shard
    std::vector<Part> parts;           // per segment of buf
    std::vector<T> flat;               // [padded] flat buffer
    std::vector<T> shard_w, shard_g;   // [shard] master values and reduced gradients
  };
  Status build_zero0(Model<T>& model, Comm* world);
  Status build_zero1(Model<T>& model, Comm* world);
  // The slots of `f` (its buffer and shard set): every segment's Param, the parts in the own range.
  Status add_flat(Model<T>& model, const std::vector<TensorMeta>& tensors, Flat& f, bool expert);
  // Expert parallel: this rank's expert buffer (of every zero_buffers) and its group's communicator.
  Status find_expert_buffer(Model<T>& model, const std::vector<TensorMeta>& tensors, Comm* world);
  Status needs_world(const char* what) const;

  Layout layout_;                      // the run's layout (either form)
  Layout view_;                        // its stage view for this rank's (pipeline, stage)
  int pp_rank_ = 0, dp_rank_ = 0, tp_rank_ = 0;
  BasicAdamW<T> adam_;
  std::vector<Whole> params_;          // every Param with elements, canonical order
  std::vector<bool> counted_;          // zero 1, per adam_ slot: counted in the gradient norm
  std::vector<std::vector<Box>> counted_boxes_;  // zero 0, per adam_ slot: the parts counted
  std::shared_ptr<ReplicaSum> replicas_;  // zero 0: every Param; zero 1: the tied embedding (or null)
  std::vector<HeldBox<T>> summed_;     // this rank's boxes of the tensors replicas_ sums
  Flat dense_;                         // zero 1: the stage's dense buffer, sharded over the DP group
  Flat expert_;                        // zero 1, expert parallel: the expert buffer, over edp_
  std::shared_ptr<Comm> edp_;          // the ranks sharing expert_'s buffer, in its members' order
};

template <>
std::vector<HeldRegion> ParallelOptimizer<float>::held_regions();

}  // namespace ckpt::trainer
