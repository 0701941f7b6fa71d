#include "reshard/dist/comm.h"

#include <algorithm>

namespace ckpt {

namespace {

int max_tp(const Layout& l) {
  int m = 1;
  for (int p = 0; p < l.num_pipelines(); ++p)
    for (int s = 0; s < l.num_stages(p); ++s) m = std::max(m, l.stage_tp(p, s));
  return m;
}

}  // namespace

Result<LayoutGroups> LayoutGroups::make(Comm& world, const Layout& layout) {
  if (layout.symmetric() && (layout.tp < 1 || layout.pp < 1 || layout.dp < 1))
    return Status::InvalidArgument("the layout " + layout.to_string() + " has a size below 1");
  if (!layout.symmetric()) CKPT_RETURN_IF_ERROR(layout.validate());
  if (world.size() != layout.world_size())
    return Status::Error("WorldSizeMismatch", "the layout " + layout.to_string() + " needs " +
                                                  std::to_string(layout.world_size()) + " ranks, but " +
                                                  std::to_string(world.size()) + " were started (mpirun -np)");
  LayoutGroups g;
  const int r = world.rank(), W = layout.world_size(), T = max_tp(layout);
  const RankPlace at = layout.place_of_rank(r);
  g.pp_rank = at.stage;
  g.dp_rank = at.pipeline;
  g.tp_rank = at.tp_rank;
  const int p = at.pipeline, s = at.stage, t = at.tp_rank, last = layout.num_stages(p) - 1;
  // Colors are first ranks of the group (or W + r for a group of one), unique per group.
  CKPT_ASSIGN_OR_RETURN(g.tp, world.split(layout.rank_of(s, p, 0), t));
  const bool dp_peers = layout.uniform_pipelines();  // stage s, TP rank t of every pipeline
  CKPT_ASSIGN_OR_RETURN(g.dp, world.split(dp_peers ? layout.rank_of(s, 0, t) : W + r, dp_peers ? p : 0));
  CKPT_ASSIGN_OR_RETURN(g.pp, world.split(p * T + t, s));
  CKPT_ASSIGN_OR_RETURN(g.model, world.split(p, r));
  const bool end_stage = last > 0 && (s == 0 || s == last) && layout.stage_tp(p, 0) == layout.stage_tp(p, last);
  CKPT_ASSIGN_OR_RETURN(g.embedding, world.split(end_stage ? p * T + t : layout.num_pipelines() * T + r, s));
  CKPT_ASSIGN_OR_RETURN(g.world, world.split(0, r));
  return g;
}

}  // namespace ckpt
