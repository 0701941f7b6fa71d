#include "reshard/comm.h"

namespace ckpt {

Result<LayoutGroups> LayoutGroups::make(Comm& world, const Layout& layout) {
  if (layout.tp < 1 || layout.pp < 1 || layout.dp < 1)
    return Status::InvalidArgument("the layout " + layout.to_string() + " has a size below 1");
  if (world.size() != layout.world_size())
    return Status::Error("WorldSizeMismatch", "the layout " + layout.to_string() + " needs " +
                                                  std::to_string(layout.world_size()) + " ranks (tp*pp*dp), but " +
                                                  std::to_string(world.size()) + " were started (mpirun -np)");
  LayoutGroups g;
  const int r = world.rank(), tp = layout.tp, dp = layout.dp, pp = layout.pp;
  g.tp_rank = r % tp;
  g.dp_rank = (r / tp) % dp;
  g.pp_rank = r / (tp * dp);
  CKPT_ASSIGN_OR_RETURN(g.tp, world.split(g.pp_rank * dp + g.dp_rank, g.tp_rank));
  CKPT_ASSIGN_OR_RETURN(g.dp, world.split(g.pp_rank * tp + g.tp_rank, g.dp_rank));
  CKPT_ASSIGN_OR_RETURN(g.pp, world.split(g.dp_rank * tp + g.tp_rank, g.pp_rank));
  CKPT_ASSIGN_OR_RETURN(g.model, world.split(g.dp_rank, r));
  const bool end_stage = pp > 1 && (g.pp_rank == 0 || g.pp_rank == pp - 1);
  const int emb_color = end_stage ? g.dp_rank * tp + g.tp_rank : dp * tp + r;
  CKPT_ASSIGN_OR_RETURN(g.embedding, world.split(emb_color, g.pp_rank));
  return g;
}

}  // namespace ckpt
