#include "trainer/model/moe_dispatch.h"

#include <algorithm>
#include <numeric>

namespace ckpt::trainer {

Result<ExpertGroups> ExpertGroups::make(Comm& world, const Layout& layout, int pp_rank, int dp_rank, int tp_rank,
                                        Comm* tp) {
  if (!layout.symmetric())
    return Status::Error("LayoutUnsupported", "expert parallelism in the trainer needs a symmetric layout, got " +
                                                  layout.to_string());
  ExpertGroups g;
  g.coord = layout.expert_coord(dp_rank, tp_rank);
  g.etp_size = layout.expert_tp();
  g.ep_size = layout.ep;
  g.edp_size = layout.tp * layout.dp / (g.etp_size * g.ep_size);
  g.tp = tp;
  const Layout::ExpertCoord& c = g.coord;
  // Colours unique per (stage, the two other coordinates); keys the group's own coordinate.
  const int s = pp_rank;
  CKPT_ASSIGN_OR_RETURN(g.ep, world.split((s * g.edp_size + c.edp) * g.etp_size + c.etp, c.ep));
  CKPT_ASSIGN_OR_RETURN(g.etp, world.split((s * g.edp_size + c.edp) * g.ep_size + c.ep, c.etp));
  if (g.ep.size() != g.ep_size || g.etp.size() != g.etp_size)
    return Status::Internal("expert groups of " + layout.to_string() + ": sizes " + std::to_string(g.ep.size()) + "/" +
                            std::to_string(g.etp.size()));
  return g;
}

Result<std::unique_ptr<ExpertGroups>> ExpertGroups::make_if_expert_parallel(Comm& world, const Layout& layout, bool moe,
                                                                             LayoutGroups& g) {
  if (!moe || !layout.expert_parallel()) return std::unique_ptr<ExpertGroups>();
  CKPT_ASSIGN_OR_RETURN(ExpertGroups eg, make(world, layout, g.pp_rank, g.dp_rank, g.tp_rank, &g.tp));
  return std::make_unique<ExpertGroups>(std::move(eg));
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
