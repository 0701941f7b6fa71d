// MoeMlp<T>: the expert-parallel forward and backward (docs/MOE.md "Expert parallelism in the
// trainer"). Per layer, on a rank with expert coordinates (etp, ep, edp) holding the El = E/ep
// experts of its ep rank and the F/etp slice of their width (Fl):
// forward   x [n, D] replicated over TP; own tokens [lo, lo + own) (TP block)
//   route: probs, top-k, rows R = own * k grouped by expert
//   counts [ep * El] to the ep peers (exchange_counts), then all-gathered over etp
//   rows of expert e to ep rank e / El (exchange_rows)          -> A  [Ra, D]
//   all-gather over etp (gather_rows)                           -> Gd [Rg, D] (etp peer, ep source, expert)
//   permuted expert-major, SwiGLU with the local slices          -> partial outputs [Rg, D]
//   reduce-scatter over etp (scatter_sum_rows)                   -> [Ra, D]
//   back to the sources (exchange_rows)                          -> y rows [R, D]
//   y_own[t] = sum of weight * row; all-gather over TP           -> y [n, D] replicated
// backward  the same path with the rows' gradients (dy rows out, dx rows back), the router on the
//   own tokens (its gradient summed over TP here, so TP replicas hold the same gradient), dx
//   all-gathered over TP. Expert gradients are the sums over the rows this rank computed: every
//   holder of an expert element adds its share (trainer/optim/replica_sum.h).
// (After moe_mlp.cc in file order: its explicit instantiation of MoeMlp comes first in a unity
// build, then these members' own.)
#include <algorithm>
#include <chrono>
#include <cmath>

#include "trainer/model/moe_mlp.h"
#include "trainer/model/ops.h"

namespace ckpt::trainer {

namespace {

// Adds the wall seconds of its life to *acc (the all-to-all share of the step line).
class MoeEpTimer {
 public:
  explicit MoeEpTimer(double* acc) : acc_(acc), t0_(std::chrono::steady_clock::now()) {}
  ~MoeEpTimer() { *acc_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }
  MoeEpTimer(const MoeEpTimer&) = delete;
  MoeEpTimer& operator=(const MoeEpTimer&) = delete;

 private:
  double* acc_;
  std::chrono::steady_clock::time_point t0_;
};

int64_t moe_ep_sum(const std::vector<int64_t>& v, int64_t a, int64_t b) {
  int64_t s = 0;
  for (int64_t i = a; i < b; ++i) s += v[static_cast<size_t>(i)];
  return s;
}

// The row counts of one dispatch or combine: rows to / from each ep peer, and the rows each etp
// peer received (the gather / scatter over etp).
struct MoeEpCounts {
  std::vector<int64_t> send, recv, per_q;
};
template <class T>
MoeEpCounts moe_ep_counts(const MoeActs<T>& a, int P, int Q, int64_t El) {
  MoeEpCounts c{std::vector<int64_t>(static_cast<size_t>(P)), std::vector<int64_t>(static_cast<size_t>(P)),
                std::vector<int64_t>(static_cast<size_t>(Q))};
  for (int j = 0; j < P; ++j) {
    c.send[static_cast<size_t>(j)] = a.first[static_cast<size_t>((j + 1) * El)] - a.first[static_cast<size_t>(j * El)];
    c.recv[static_cast<size_t>(j)] = moe_ep_sum(a.ep_recv, j * El, (j + 1) * El);
  }
  for (int q = 0; q < Q; ++q) c.per_q[static_cast<size_t>(q)] = moe_ep_sum(a.ep_all, q * P * El, (q + 1) * P * El);
  return c;
}

// The rows of every TP rank's block of n tokens.
std::vector<int64_t> moe_ep_tp_rows(int64_t n, int size) {
  std::vector<int64_t> rows(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) rows[static_cast<size_t>(r)] = row_block_begin(n, r + 1, size) - row_block_begin(n, r, size);
  return rows;
}

}  // namespace

// Own rows [R, D] (expert-grouped) -> gathered [Rg, D] (etp peer, ep source, local expert).
template <class T>
Status MoeMlp<T>::ep_dispatch(MoeActs<T>& a, const T* rows, std::vector<T>* gathered) {
  ExpertGroups& g = *ep_;
  MoeEpTimer timer(&g.a2a_s);
  const MoeEpCounts c = moe_ep_counts(a, g.ep_size, g.etp_size, El_);
  resize_buffer(ep_c_, moe_ep_sum(c.recv, 0, g.ep_size) * D_);
  CKPT_RETURN_IF_ERROR(exchange_rows<T>(g.ep, rows, c.send, ep_c_.data(), c.recv, D_));
  resize_buffer(*gathered, moe_ep_sum(c.per_q, 0, g.etp_size) * D_);
  return gather_rows<T>(g.etp, ep_c_.data(), c.per_q, gathered->data(), D_);
}

// Gathered partial rows [Rg, D] -> own rows [R, D]: summed over etp, back to their sources.
template <class T>
Status MoeMlp<T>::ep_combine(MoeActs<T>& a, const T* gathered, T* rows) {
  ExpertGroups& g = *ep_;
  MoeEpTimer timer(&g.a2a_s);
  const MoeEpCounts c = moe_ep_counts(a, g.ep_size, g.etp_size, El_);
  resize_buffer(ep_c_, moe_ep_sum(c.recv, 0, g.ep_size) * D_);
  CKPT_RETURN_IF_ERROR(scatter_sum_rows<T>(g.etp, gathered, c.per_q, ep_c_.data(), D_));
  return exchange_rows<T>(g.ep, ep_c_.data(), c.recv, rows, c.send, D_);
}

// a.xg [Rg, D] (expert-major) through the local slices; out [Rg, D] gathered order (partial over etp).
template <class T>
void MoeMlp<T>::ep_experts_forward(MoeActs<T>& a, std::vector<T>* out) {
  const int64_t Rg = a.efirst.back();
  resize_buffer(ep_b_, Rg * D_);
  experts_swiglu_forward(a, a.efirst, El_, ep_b_.data());
  resize_buffer(*out, Rg * D_);
  for (int64_t k = 0; k < Rg; ++k) std::copy_n(ep_b_.data() + k * D_, D_, out->data() + a.perm[static_cast<size_t>(k)] * D_);
}

// dout [Rg, D] gathered order -> dx [Rg, D] gathered order (partial over etp); weight gradients += .
template <class T>
void MoeMlp<T>::ep_experts_backward(MoeActs<T>& a, const std::vector<T>& dout, std::vector<T>* dx) {
  const int64_t Rg = a.efirst.back();
  resize_buffer(dye_, Rg * D_);
  resize_buffer(dxg_, Rg * D_);
  for (int64_t k = 0; k < Rg; ++k) std::copy_n(dout.data() + a.perm[static_cast<size_t>(k)] * D_, D_, dye_.data() + k * D_);
  for (int64_t e = 0; e < El_; ++e) {
    const int64_t r0 = a.efirst[static_cast<size_t>(e)], ne = a.efirst[static_cast<size_t>(e) + 1] - r0;
    if (ne == 0) continue;
    resize_buffer(dh_, ne * Fl_);
    resize_buffer(dg_, ne * Fl_);
    resize_buffer(du_, ne * Fl_);
    const T* xe = a.xg.data() + r0 * D_;
    const T *ge = a.g.data() + r0 * Fl_, *ue = a.u.data() + r0 * Fl_, *he = a.h.data() + r0 * Fl_;
    T* dxe = dxg_.data() + r0 * D_;
    linear_backward<T>(he, down_proj.w.data() + e * D_ * Fl_, dye_.data() + r0 * D_, dh_.data(), false,
                       down_proj.g.data() + e * D_ * Fl_, ne, Fl_, D_);
    swiglu_backward<T>(ge, ue, dh_.data(), dg_.data(), du_.data(), ne * Fl_);
    linear_backward<T>(xe, gate_proj.w.data() + e * Fl_ * D_, dg_.data(), dxe, false, gate_proj.g.data() + e * Fl_ * D_,
                       ne, D_, Fl_);
    linear_backward<T>(xe, up_proj.w.data() + e * Fl_ * D_, du_.data(), dxe, true, up_proj.g.data() + e * Fl_ * D_, ne,
                       D_, Fl_);
  }
  resize_buffer(*dx, Rg * D_);
  for (int64_t k = 0; k < Rg; ++k) std::copy_n(dxg_.data() + k * D_, D_, dx->data() + a.perm[static_cast<size_t>(k)] * D_);
}

// The load of the own rows and their router statistics (Model sums them over TP).
template <class T>
void MoeMlp<T>::count_load(const MoeActs<T>& a, int64_t n, RouterTotals* totals) {
  load_.resize(static_cast<size_t>(E_), 0);
  for (int64_t e = 0; e < E_; ++e) load_[static_cast<size_t>(e)] += a.first[static_cast<size_t>(e) + 1] - a.first[static_cast<size_t>(e)];
  if (!totals) return;
  for (int64_t e = 0; e < E_; ++e)
    totals->count[static_cast<size_t>(e)] += static_cast<double>(a.first[static_cast<size_t>(e) + 1] - a.first[static_cast<size_t>(e)]);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t e = 0; e < E_; ++e) totals->psum[static_cast<size_t>(e)] += static_cast<double>(a.probs[t * E_ + e]);
  totals->rows += n;
}

template <class T>
std::vector<double> MoeMlp<T>::take_counts() {
  std::vector<double> out(load_.begin(), load_.end());
  out.resize(static_cast<size_t>(E_), 0.0);
  std::fill(load_.begin(), load_.end(), 0);
  return out;
}

namespace {

// The counts of a.first to the ep peers, gathered over etp; the expert-major order of the
// gathered rows (a.efirst, a.perm).
template <class T>
Status moe_ep_plan(ExpertGroups& g, MoeActs<T>& a, int64_t E, int64_t El) {
  const int P = g.ep_size, Q = g.etp_size;
  {
    MoeEpTimer timer(&g.a2a_s);
    std::vector<int64_t> send(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) send[static_cast<size_t>(e)] = a.first[static_cast<size_t>(e) + 1] - a.first[static_cast<size_t>(e)];
    CKPT_RETURN_IF_ERROR(exchange_counts(g.ep, send, El, &a.ep_recv));
    a.ep_all.assign(static_cast<size_t>(Q * P * El), 0);
    CKPT_RETURN_IF_ERROR(g.etp.all_gather<int64_t>(a.ep_recv.data(), a.ep_all.data(), P * El));
  }
  std::vector<int64_t> base(a.ep_all.size());
  int64_t off = 0;
  for (size_t i = 0; i < base.size(); ++i) {  // gathered order: etp peer, ep source, local expert
    base[i] = off;
    off += a.ep_all[i];
  }
  a.efirst.assign(static_cast<size_t>(El) + 1, 0);
  a.perm.resize(static_cast<size_t>(off));
  int64_t k = 0;
  for (int64_t e = 0; e < El; ++e) {
    for (int64_t qs = 0; qs < Q * P; ++qs) {
      const size_t i = static_cast<size_t>(qs * El + e);
      for (int64_t r = 0; r < a.ep_all[i]; ++r) a.perm[static_cast<size_t>(k++)] = base[i] + r;
    }
    a.efirst[static_cast<size_t>(e) + 1] = k;
  }
  return Status::Ok();
}

}  // namespace

template <class T>
Status MoeMlp<T>::ep_forward(int slot, const T* x, T* y, int64_t n, RouterTotals* totals) {
  ExpertGroups& g = *ep_;
  MoeActs<T>& a = acts_[static_cast<size_t>(slot)];
  const int tps = g.tp ? g.tp->size() : 1, tpr = g.tp ? g.tp->rank() : 0;
  a.lo = row_block_begin(n, tpr, tps);
  a.own = row_block_begin(n, tpr + 1, tps) - a.lo;
  const T* xo = x + a.lo * D_;
  route(a, xo, a.own);
  const int64_t R = a.own * K_;
  CKPT_RETURN_IF_ERROR(moe_ep_plan<T>(g, a, E_, El_));
  resize_buffer(ep_b_, R * D_);
  for (int64_t r = 0; r < R; ++r) std::copy_n(xo + a.row_token[static_cast<size_t>(r)] * D_, D_, ep_b_.data() + r * D_);
  CKPT_RETURN_IF_ERROR(ep_dispatch(a, ep_b_.data(), &ep_a_));
  const int64_t Rg = a.efirst.back();
  resize_buffer(a.xg, Rg * D_);
  for (int64_t k = 0; k < Rg; ++k) std::copy_n(ep_a_.data() + a.perm[static_cast<size_t>(k)] * D_, D_, a.xg.data() + k * D_);
  ep_experts_forward(a, &ep_a_);
  resize_buffer(a.y, R * D_);
  CKPT_RETURN_IF_ERROR(ep_combine(a, ep_a_.data(), a.y.data()));
  T* yo = y + a.lo * D_;
  std::fill(yo, yo + a.own * D_, T(0));
  for (int64_t r = 0; r < R; ++r) {
    const int64_t t = a.row_token[static_cast<size_t>(r)];
    const T w = a.weight[t * K_ + a.row_pick[static_cast<size_t>(r)]];
    const T* yr = a.y.data() + r * D_;
    for (int64_t d = 0; d < D_; ++d) yo[t * D_ + d] += yr[d] * w;
  }
  if (Fs_ > 0 && tps == 1) shared_forward(a, xo, yo, a.own);
  count_load(a, a.own, totals);
  if (tps == 1) return Status::Ok();
  {
    MoeEpTimer timer(&g.a2a_s);
    CKPT_RETURN_IF_ERROR(gather_rows<T>(*g.tp, yo, moe_ep_tp_rows(n, tps), y, D_));
  }
  return Fs_ > 0 ? ep_shared_forward(a, x, y, n) : Status::Ok();
}

template <class T>
Status MoeMlp<T>::ep_backward(int slot, const T* x, const T* dy, T* dx, int64_t n, const T* aux_dp) {
  ExpertGroups& g = *ep_;
  MoeActs<T>& a = acts_[static_cast<size_t>(slot)];
  const int tps = g.tp ? g.tp->size() : 1;
  const int64_t own = a.own, R = own * K_;
  const T* xo = x + a.lo * D_;
  const T* dyo = dy + a.lo * D_;
  T* dxo = dx + a.lo * D_;
  resize_buffer(dw_, own * K_);
  resize_buffer(dlog_, own * E_);
  resize_buffer(ep_b_, R * D_);
  for (int64_t r = 0; r < R; ++r) {  // row gradient = w * dy[t]; dw = dy[t] . y_row
    const int64_t t = a.row_token[static_cast<size_t>(r)], j = a.row_pick[static_cast<size_t>(r)];
    const T w = a.weight[t * K_ + j];
    const T* dyt = dyo + t * D_;
    const T* yr = a.y.data() + r * D_;
    double dot = 0;
    for (int64_t d = 0; d < D_; ++d) {
      ep_b_[static_cast<size_t>(r * D_ + d)] = dyt[d] * w;
      dot += static_cast<double>(dyt[d]) * static_cast<double>(yr[d]);
    }
    dw_[static_cast<size_t>(t * K_ + j)] = static_cast<T>(dot);
  }
  CKPT_RETURN_IF_ERROR(ep_dispatch(a, ep_b_.data(), &ep_a_));
  ep_experts_backward(a, ep_a_, &ep_b_);
  resize_buffer(ep_a_, R * D_);
  CKPT_RETURN_IF_ERROR(ep_combine(a, ep_b_.data(), ep_a_.data()));
  std::fill(dxo, dxo + own * D_, T(0));
  for (int64_t r = 0; r < R; ++r) {
    T* dxt = dxo + a.row_token[static_cast<size_t>(r)] * D_;
    const T* dr = ep_a_.data() + r * D_;
    for (int64_t d = 0; d < D_; ++d) dxt[d] += dr[d];
  }
  if (Fs_ > 0 && tps == 1) shared_backward(a, xo, dyo, dxo, own);
  router_grad(a, dw_.data(), aux_dp, dlog_.data(), own);
  if (tps == 1) {
    linear_backward<T>(xo, router.w.data(), dlog_.data(), dxo, true, router.g.data(), own, D_, E_);
    return Status::Ok();
  }
  // The router's gradient of this call summed over TP: every TP rank then holds the same one.
  std::vector<T> rg(router.g.size(), T(0));
  linear_backward<T>(xo, router.w.data(), dlog_.data(), dxo, true, rg.data(), own, D_, E_);
  CKPT_RETURN_IF_ERROR(g.tp->all_reduce_sum<T>(rg.data(), static_cast<int64_t>(rg.size())));
  for (size_t i = 0; i < rg.size(); ++i) router.g[i] += rg[i];
  {
    MoeEpTimer timer(&g.a2a_s);
    CKPT_RETURN_IF_ERROR(gather_rows<T>(*g.tp, dxo, moe_ep_tp_rows(n, tps), dx, D_));
  }
  return Fs_ > 0 ? ep_shared_backward(a, x, dy, dx, n) : Status::Ok();
}

// y[n, D] += gate * shared(x) on every token, shared = down(silu(gate_proj x) * up_proj x) summed
// over the TP ranks' F slices (Fsl = Fs/tp each, the store's boxes); gate = sigmoid(x w_s^T) or 1.
template <class T>
Status MoeMlp<T>::ep_shared_forward(MoeActs<T>& a, const T* x, T* y, int64_t n) {
  shared_mlp_forward(a, x, n);
  CKPT_RETURN_IF_ERROR(ep_->tp->all_reduce_sum<T>(a.sy.data(), n * D_));  // the F slices' sum
  shared_gate_forward(a, x, y, n);
  return Status::Ok();
}

// dx[n, D] += the shared expert's input gradient: the F slices' parts summed over TP, then the
// gate's (the same on every TP rank: x and the gate are replicated).
template <class T>
Status MoeMlp<T>::ep_shared_backward(MoeActs<T>& a, const T* x, const T* dy, T* dx, int64_t n) {
  std::vector<T> dz, dxs(static_cast<size_t>(n * D_), T(0));
  shared_gate_backward(a, x, dy, dx, n, &dz);
  shared_mlp_backward(a, x, dxs.data(), n);
  CKPT_RETURN_IF_ERROR(ep_->tp->all_reduce_sum<T>(dxs.data(), n * D_));
  for (int64_t i = 0; i < n * D_; ++i) dx[i] += dxs[static_cast<size_t>(i)];
  return Status::Ok();
}

#define CKPT_INSTANTIATE_MOE_EP(T)                                                                     \
  template Status MoeMlp<T>::ep_dispatch(MoeActs<T>&, const T*, std::vector<T>*);                     \
  template Status MoeMlp<T>::ep_combine(MoeActs<T>&, const T*, T*);                                   \
  template void MoeMlp<T>::ep_experts_forward(MoeActs<T>&, std::vector<T>*);                          \
  template void MoeMlp<T>::ep_experts_backward(MoeActs<T>&, const std::vector<T>&, std::vector<T>*);  \
  template void MoeMlp<T>::count_load(const MoeActs<T>&, int64_t, RouterTotals*);                     \
  template std::vector<double> MoeMlp<T>::take_counts();                                              \
  template Status MoeMlp<T>::ep_forward(int, const T*, T*, int64_t, RouterTotals*);                   \
  template Status MoeMlp<T>::ep_backward(int, const T*, const T*, T*, int64_t, const T*);                \
  template Status MoeMlp<T>::ep_shared_forward(MoeActs<T>&, const T*, T*, int64_t);                   \
  template Status MoeMlp<T>::ep_shared_backward(MoeActs<T>&, const T*, const T*, T*, int64_t);
CKPT_INSTANTIATE_MOE_EP(float)
CKPT_INSTANTIATE_MOE_EP(double)
#undef CKPT_INSTANTIATE_MOE_EP

}  // namespace ckpt::trainer
