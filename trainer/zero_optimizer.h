// ParallelOptimizer: AdamW for one rank of a parallel layout, with the optimizer state either
// replicated over DP (zero 0: one slot per Param this rank holds, as add_param_slots) or sharded
// ZeRO-1 style (zero 1: this DP rank's range of the stage's flat buffer, reshard/zero_layout.h,
// the same definition the checkpoint store uses; one slot per segment part inside the range,
// whose Region is a flat range of the Param's TP box).
// It also owns the DP side of a step: the gradient reduction over DP (zero 0: all-reduce of every
// gradient; zero 1: reduce-scatter of the flat gradient buffer into the own range), this rank's
// share of the global gradient norm (each element counted on exactly one rank of the world), and,
// for zero 1, the all-gather of the updated weights back into every DP rank's Params.
// The Model must outlive the optimizer and keep its parameter buffers (they are not resized).
// Thread safety: one thread at a time; the Comm calls must come from the main thread.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "formats/region.h"
#include "formats/status.h"
#include "reshard/comm.h"
#include "reshard/layout.h"
#include "reshard/zero_layout.h"
#include "trainer/adamw.h"
#include "trainer/held_region.h"
#include "trainer/model.h"

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
  // The optimizer of `model`, this rank's shard (stage pp_rank, DP rank dp_rank, TP rank tp_rank
  // of `layout`). zero 1: errors when a Param is missing from the stage's flat buffer or its box
  // disagrees with the sharding rules.
  static Result<ParallelOptimizer> create(Model<T>& model, const Layout& layout, int pp_rank, int dp_rank,
                                          int tp_rank, const AdamWOptions& opt = {});

  BasicAdamW<T>& adam() { return adam_; }
  const BasicAdamW<T>& adam() const { return adam_; }
  int zero() const { return layout_.zero; }
  // zero 1: the flat buffer of kind optimizer.exp_avg of this rank's (stage, TP rank); its
  // exp_avg_sq twin has the same segments. zero 0: empty.
  const ZeroBuffer& flat_layout() const { return buf_; }

  // Sums the Params' gradients over `dp` (size layout.dp): zero 0 all-reduce (every DP rank gets
  // the sum in Param::g); zero 1 reduce-scatter of the padded flat buffer (this rank's range of
  // the sum goes to its slots; Param::g is left as it was).
  Status reduce_gradients(Comm& dp);
  // Sum of the squared reduced gradients this rank counts: every element of the world's
  // gradients once (zero 0: on DP rank 0 only; zero 1: the own range; TP-replicated boxes on the
  // lowest TP rank holding them; the tied embedding on the first stage only).
  double grad_sq_share() const;
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
  std::vector<HeldRegion> held_regions()
    requires std::is_same_v<T, float>;

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
  Status build_zero0(Model<T>& model);
  Status build_zero1(Model<T>& model);

  Layout layout_;
  int pp_rank_ = 0, dp_rank_ = 0, tp_rank_ = 0;
  BasicAdamW<T> adam_;
  std::vector<Whole> params_;          // every Param with elements, canonical order
  std::vector<bool> counted_;          // per adam_ slot: counted in the gradient norm
  ZeroBuffer buf_;                     // zero 1
  std::vector<Part> parts_;            // zero 1: per segment of buf_
  std::vector<T> flat_;                // zero 0: packed gradients; zero 1: [padded] flat buffer
  std::vector<T> shard_w_, shard_g_;   // zero 1: [shard] master values and reduced gradients
};

}  // namespace ckpt::trainer
