// Where a tensor lives under any Layout (symmetric or general form): every (pipeline, stage)
// holding it, with the box of each of that stage's TP ranks. The model knowledge stays in
// ShardingRules: each stage is placed under Layout::stage_view (a symmetric layout with that
// stage's tp, ep, etp and its pipeline's split), so the rules never see the general form, and a
// stage's experts follow the symmetric expert rules over its view's ranks. The planner
// (which ranks store what), rank_view (what a rank holds) and the trainer's replica sums all
// start here. Pure functions; thread safe.
#pragma once

#include <vector>

#include "formats/base/status.h"
#include "formats/tensor/region.h"
#include "formats/tensor/tensor_io.h"
#include "reshard/layout/layout.h"
#include "reshard/layout/sharding.h"

namespace ckpt {

struct StagePlacement {
  int pipeline = 0;
  int stage = 0;
  std::vector<Box> tp_boxes;     // size stage_tp(pipeline, stage): the box of each TP rank
  bool optimizer_state = false;  // an optimizer tensor (ZeRO-1 flat-shards it when layout.zero == 1)
  bool expert = false;           // TensorPlacement::expert
};

// Every (pipeline, stage) of `layout` that holds `tensor`, pipelines in order, then stages in
// order. Errors: the rules' (naming the tensor), and Internal for placements the rules got wrong
// (box count != tp, a box outside the tensor, a stage outside the pipeline).
Result<std::vector<StagePlacement>> place_in_layout(const TensorMeta& tensor, const Layout& layout,
                                                    const ShardingRules& rules);

// rules.check_layout on the stage view of every stage; for the general form an error is
// prefixed with "pipeline P stage S (LAYOUT): ".
Status check_layout_views(const Layout& layout, const ShardingRules& rules);

}  // namespace ckpt
