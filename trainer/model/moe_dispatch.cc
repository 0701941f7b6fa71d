#include "trainer/model/moe_dispatch.h"

#include <algorithm>
#include <numeric>

namespace ckpt::trainer {

namespace {

// The world rank of stage-local rank r (= view pipeline * tp + tp rank) of stage `stage` of
// `view`, the stage view of (pipeline, stage): a view of non-uniform pipelines (dp 1) is the
// pipeline's own ranks, else the view's pipelines are the layout's.
int expert_member_rank(const Layout& layout, const Layout& view, int pipeline, int stage, int r) {
  return layout.rank_of(stage, view.dp == 1 ? pipeline : r / view.tp, r % view.tp);
}

}  // namespace

bool layout_uses_expert_groups(const Layout& layout) {
  for (int p = 0; p < layout.num_pipelines(); ++p)
    for (int s = 0; s < layout.num_stages(p); ++s)
      if (stage_uses_expert_groups(layout.stage_view(p, s))) return true;
  return false;
}

Result<std::unique_ptr<ExpertGroups>> ExpertGroups::make(Comm& world, const Layout& layout, int pipeline, int stage,
                                                         int tp_rank, Comm* tp) {
  // Both forms: the groups of the rank's stage view (the store's expert boxes, Layout::stage_view).
  const Layout view = layout.stage_view(pipeline, stage);
  if (!stage_uses_expert_groups(view)) {  // a stage without expert groups: still takes part in both splits
    CKPT_ASSIGN_OR_RETURN(Comm a, world.split(world.rank(), 0));
    CKPT_ASSIGN_OR_RETURN(Comm b, world.split(world.rank(), 0));
    return std::unique_ptr<ExpertGroups>();
  }
  auto g = std::make_unique<ExpertGroups>();
  g->coord = view.expert_coord(view.dp == 1 ? 0 : pipeline, tp_rank);
  g->etp_size = view.expert_tp();
  g->ep_size = view.ep;
  g->edp_size = view.tp * view.dp / (g->etp_size * g->ep_size);
  g->tp = tp;
  const Layout::ExpertCoord& c = g->coord;
  // Colours: the world rank of the group's first member (unique over the world); keys: the group's
  // own coordinate.
  const int ep0 = c.edp * g->etp_size * g->ep_size + c.etp, etp0 = (c.edp * g->ep_size + c.ep) * g->etp_size;
  CKPT_ASSIGN_OR_RETURN(g->ep, world.split(expert_member_rank(layout, view, pipeline, stage, ep0), c.ep));
  CKPT_ASSIGN_OR_RETURN(g->etp, world.split(expert_member_rank(layout, view, pipeline, stage, etp0), c.etp));
  if (g->ep.size() != g->ep_size || g->etp.size() != g->etp_size)
    return Status::Internal("expert groups of " + layout.to_string() + ": sizes " + std::to_string(g->ep.size()) + "/" +
                            std::to_string(g->etp.size()));
  return g;
}

Result<std::unique_ptr<ExpertGroups>> ExpertGroups::make_if_expert_parallel(Comm& world, const Layout& layout, bool moe,
                                                                             LayoutGroups& g) {
  if (!moe || !layout_uses_expert_groups(layout)) return std::unique_ptr<ExpertGroups>();
  return make(world, layout, g.dp_rank, g.pp_rank, g.tp_rank, &g.tp);
}

Status exchange_counts(Comm& c, const std::vector<int64_t>& send, int64_t m, std::vector<int64_t>* recv) {
  const int n = c.size(), me = c.rank();
  recv->assign(static_cast<size_t>(n * m), 0);
  std::copy_n(send.begin() + me * m, m, recv->begin() + me * m);
  std::vector<Comm::Send<int64_t>> sends;
  std::vector<Comm::Recv<int64_t>> recvs;
  for (int j = 0; j < n; ++j) {
    if (j == me || m == 0) continue;
    sends.push_back({send.data() + j * m, m, j});
    recvs.push_back({recv->data() + j * m, m, j});
  }
  if (sends.empty()) return Status::Ok();
  return c.exchange<int64_t>(sends, recvs, 0);
}

template <class T>
Status exchange_rows(Comm& c, const T* send, const std::vector<int64_t>& send_rows, T* recv,
                     const std::vector<int64_t>& recv_rows, int64_t D) {
  const int n = c.size(), me = c.rank();
  std::vector<Comm::Send<T>> sends;
  std::vector<Comm::Recv<T>> recvs;
  int64_t so = 0, ro = 0;
  for (int j = 0; j < n; ++j) {
    const int64_t sn = send_rows[static_cast<size_t>(j)], rn = recv_rows[static_cast<size_t>(j)];
    if (j == me) {
      std::copy_n(send + so * D, sn * D, recv + ro * D);  // sn == rn: the own block
    } else {
      if (sn > 0) sends.push_back({send + so * D, sn * D, j});
      if (rn > 0) recvs.push_back({recv + ro * D, rn * D, j});
    }
    so += sn;
    ro += rn;
  }
  if (sends.empty() && recvs.empty()) return Status::Ok();
  return c.exchange<T>(sends, recvs, 0);
}

template <class T>
Status gather_rows(Comm& c, const T* mine, const std::vector<int64_t>& rows, T* out, int64_t D) {
  const int n = c.size(), me = c.rank();
  std::vector<Comm::Send<T>> sends;
  std::vector<Comm::Recv<T>> recvs;
  const int64_t mn = rows[static_cast<size_t>(me)];
  int64_t off = 0;
  for (int j = 0; j < n; ++j) {
    const int64_t rn = rows[static_cast<size_t>(j)];
    if (j == me) {
      if (out + off * D != mine) std::copy_n(mine, mn * D, out + off * D);
    } else {
      if (mn > 0) sends.push_back({mine, mn * D, j});
      if (rn > 0) recvs.push_back({out + off * D, rn * D, j});
    }
    off += rn;
  }
  if (sends.empty() && recvs.empty()) return Status::Ok();
  return c.exchange<T>(sends, recvs, 0);
}

template <class T>
Status scatter_sum_rows(Comm& c, const T* in, const std::vector<int64_t>& rows, T* out, int64_t D) {
  const int n = c.size(), me = c.rank();
  const int64_t mn = rows[static_cast<size_t>(me)];
  std::vector<int64_t> off(static_cast<size_t>(n) + 1, 0);
  for (int j = 0; j < n; ++j) off[static_cast<size_t>(j) + 1] = off[static_cast<size_t>(j)] + rows[static_cast<size_t>(j)];
  std::vector<T> got(static_cast<size_t>(std::max(n - 1, 0) * mn * D));
  std::vector<Comm::Send<T>> sends;
  std::vector<Comm::Recv<T>> recvs;
  int k = 0;
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    const int64_t rn = rows[static_cast<size_t>(j)];
    if (rn > 0) sends.push_back({in + off[static_cast<size_t>(j)] * D, rn * D, j});
    if (mn > 0) recvs.push_back({got.data() + k * mn * D, mn * D, j});
    ++k;
  }
  if (!sends.empty() || !recvs.empty()) CKPT_RETURN_IF_ERROR(c.exchange<T>(sends, recvs, 0));
  // The sum in peer order (the same order on every rank of the group).
  std::fill(out, out + mn * D, T(0));
  k = 0;
  for (int j = 0; j < n; ++j) {
    const T* src = j == me ? in + off[static_cast<size_t>(me)] * D : got.data() + (k++) * mn * D;
    for (int64_t i = 0; i < mn * D; ++i) out[i] += src[i];
  }
  return Status::Ok();
}

#define CKPT_INSTANTIATE_DISPATCH(T)                                                                             \
  template Status exchange_rows<T>(Comm&, const T*, const std::vector<int64_t>&, T*, const std::vector<int64_t>&, \
                                   int64_t);                                                                      \
  template Status gather_rows<T>(Comm&, const T*, const std::vector<int64_t>&, T*, int64_t);                      \
  template Status scatter_sum_rows<T>(Comm&, const T*, const std::vector<int64_t>&, T*, int64_t);
CKPT_INSTANTIATE_DISPATCH(float)
CKPT_INSTANTIATE_DISPATCH(double)
#undef CKPT_INSTANTIATE_DISPATCH

}  // namespace ckpt::trainer
