// What every rank of a layout holds in memory, as (tensor, rank, box, flat range) records: the
// building block of the planner (reshard/planner.h: place_tensors, rank_view). Any Layout form:
// every (pipeline, stage) holding a tensor comes from place_in_layout (reshard/layout/tensor_placement.h), its
// TP rank t is world rank layout.rank_of(stage, pipeline, t). Under ZeRO-1 (layout.zero == 1,
// uniform pipelines) the optimizer tensors are held as the DP ranges of the flat buffers of
// reshard/layout/zero_layout.h (DP rank d = pipeline d). Replicas are all listed (not de-duplicated);
// empty boxes are left out. Pure functions; thread safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "formats/base/status.h"
#include "formats/tensor/region.h"
#include "formats/tensor/tensor_io.h"
#include "reshard/layout/layout.h"
#include "reshard/layout/sharding.h"

namespace ckpt {

// One rank holding elements [a, b) (row-major storage order) of a box of tensor `tensor`.
struct Holding {
  size_t tensor;
  int rank;
  Box box;
  int64_t a, b;
};

// Every holding of every rank of `layout` (or of rank `only_rank` when >= 0), grouped by tensor
// for the unsharded part, then the ZeRO-1 part by buffer. The caller validated the layout
// (Layout::validate, check_layout_views). Errors: the rules' and the placements' (naming the
// tensor), the ZeRO buffers'.
Result<std::vector<Holding>> layout_holdings(const std::vector<TensorMeta>& tensors, const Layout& layout,
                                             const ShardingRules& rules, int only_rank = -1);

// Copies the elements of `piece` (storage order) out of `held_data`, the elements of region `held`
// in its storage order, into `out`; elem_size bytes each. A planned piece lies in one rectangle of
// what its writer holds (a flat range counts as its flat_range_to_boxes rectangles): a (flat range
// of the) same box, or under a general layout a sub-box (reshard/planner.h place_tensors). False,
// copying nothing, when some part of `piece` lies in no single rectangle of `held`.
bool copy_from_held(const Region& held, const void* held_data, const Region& piece, void* out, size_t elem_size);

}  // namespace ckpt
