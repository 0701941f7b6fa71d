// ReplicaSum: the gradient sum over the replicas of a parameter under any Layout, also when the
// replicas split it differently (pipelines with other tensor-parallel sizes on the stage holding a
// layer; a tied embedding on a first and a last stage of different tp).
// Plan (make, from metadata only, identical on every rank): every rank's boxes of every tensor come
// from place_in_layout (reshard/layout/tensor_placement.h); the boxes of one tensor are cut into cells by the
// region arithmetic of formats/tensor/region.h (each holder's box in turn splits the cells so far with
// intersect / subtract_box: no finer than the grid of the holders' box boundaries), so every
// cell lies wholly inside or outside each holder's box; the cells with the same holder set are
// summed together, one all-reduce per holder set (a communicator split once per set in make;
// disjoint sets share one split), the sets in one global order on every rank (no deadlock).
// A holder set's buffer holds its cells in tensor order, then row-major cell order, neighbouring
// cells of one tensor merged into one box where they form one.
// A (pipeline, stage) contributes once per element: TP ranks of one stage that hold the same
// element (replicated norms) hold the same gradient, so only the lowest of them adds its value
// and the others add zero; every holder receives the sum. Expert tensors of an expert-parallel
// layout (StagePlacement::expert) are the exception: the ranks holding the same expert element
// computed it on different routed rows, so every holder adds its own gradient.
// Thread safety: main thread only (Comm).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "formats/base/status.h"
#include "formats/tensor/region.h"
#include "formats/tensor/tensor_io.h"
#include "reshard/dist/comm.h"
#include "reshard/layout/layout.h"
#include "reshard/layout/sharding.h"

namespace ckpt::trainer {

// A box of a global tensor that this rank holds in a buffer.
template <class T>
struct HeldBox {
  std::string tensor;
  Box box;
  T* data = nullptr;  // box.numel() values, row-major over the box
};

class ReplicaSum {
 public:
  enum class Scope {
    kWorld,     // over every (pipeline, stage) holding an element (zero 0)
    kPipeline,  // only over the stages of one pipeline (zero 1: the tied embedding; the ZeRO-1
                // reduce-scatter then sums over the pipelines)
  };

  // Collective over `world` (size layout.world_size()). `tensors`: the parameters in global view,
  // the same list on every rank (checked: ReplicaSumMismatch on every rank when one differs from
  // rank 0's). Errors: WorldSizeMismatch, check_layout_views', the placement's, the splits'.
  static Result<ReplicaSum> make(Comm& world, const Layout& layout, const ShardingRules& rules,
                                 const std::vector<TensorMeta>& tensors, Scope scope);

  // In place, collective over the world (every rank calls it, also with nothing to sum): every
  // element held by more than one (pipeline, stage) of the scope becomes, in every holder's
  // buffer, the sum of one contribution per (pipeline, stage). `mine`: exactly this rank's boxes
  // as place_in_layout gives them (each tensor and box once; any order). T: float or double.
  // Empty boxes may be left out. Errors: ReplicaSumMismatch naming the rank, tensor and boxes for
  // a box of `mine` that the plan does not give this rank (or one missing or given twice),
  // returned before any communication (the caller fails the world, as parallel_step does, or
  // the peers wait for their timeout); the Comm's, prefixed with the holder set's ranks.
  template <class T>
  Status sum(const std::vector<HeldBox<T>>& mine);

  // The parts of this rank's `box` of `tensor` that this rank counts in a world-wide reduction such
  // as the gradient norm: every element of the world is counted once, by the lowest rank holding
  // it (whatever the scope). Disjoint boxes inside `box`, possibly none.
  std::vector<Box> counted(const std::string& tensor, const Box& box) const;

  // Elements this rank contributes to all-reduces per sum() call.
  int64_t elements_per_sum() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace ckpt::trainer
