#include "trainer/model/moe_mlp.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "trainer/model/ops.h"

namespace ckpt::trainer {

double RouterTotals::aux_loss() const {
  if (rows == 0) return 0.0;
  const double r = static_cast<double>(rows);
  double s = 0;
  for (size_t e = 0; e < count.size(); ++e) s += (count[e] / r) * (psum[e] / r);
  return s * static_cast<double>(count.size());
}

Result<double> router_aux_loss_coef(const LlamaConfig& c) {
  const auto it = c.extra.find("router_aux_loss_coef");
  if (it == c.extra.end() || it->is_null()) return 0.001;
  if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() < 0)
    return Status::Error("InvalidConfig", "config key 'router_aux_loss_coef': expected a finite number >= 0, got " +
                                              it->dump());
  return it->get<double>();
}

template <class T>
MoeMlp<T>::MoeMlp(const LlamaConfig& c, const std::vector<std::pair<std::string, Shape>>& specs)
    : MoeMlp(c, specs, {}, nullptr) {}

template <class T>
MoeMlp<T>::MoeMlp(const LlamaConfig& c, const std::vector<std::pair<std::string, Shape>>& specs,
                  const std::vector<Box>& boxes, ExpertGroups* ep)
    : D_(c.hidden_size),
      E_(c.moe->num_experts),
      K_(c.moe->top_k),
      F_(c.moe->expert_intermediate),
      Fs_(c.moe->shared_intermediate),
      renorm_(c.family == ModelFamily::kMixtral || c.moe->norm_topk_prob),
      has_shared_gate_(c.moe->shared_intermediate > 0 && c.moe->shared_gate),
      ep_(ep),
      El_(ep ? E_ / ep->ep_size : E_),
      Fl_(ep ? F_ / ep->etp_size : F_),
      Fsl_(ep && ep->tp && ep->tp->size() > 1 ? Fs_ / ep->tp->size() : Fs_) {
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& [name, shape] = specs[i];
    Param<T>* p = nullptr;
    if (name.ends_with("mlp.gate.weight")) p = &router;
    else if (name.ends_with("mlp.experts.gate_proj.weight")) p = &gate_proj;
    else if (name.ends_with("mlp.experts.up_proj.weight")) p = &up_proj;
    else if (name.ends_with("mlp.experts.down_proj.weight")) p = &down_proj;
    else if (name.ends_with("mlp.shared_experts.gate_proj.weight")) p = &sh_gate;
    else if (name.ends_with("mlp.shared_experts.up_proj.weight")) p = &sh_up;
    else if (name.ends_with("mlp.shared_experts.down_proj.weight")) p = &sh_down;
    else if (name.ends_with("mlp.shared_expert_gate.weight")) p = &sh_gate_w;
    if (p && i < boxes.size()) p->allocate(name, shape, boxes[i], true);
    else if (p) p->allocate(name, shape, true);  // Model::create refused any other MoE tensor
  }
}

template <class T>
std::vector<Param<T>*> MoeMlp<T>::params() {
  std::vector<Param<T>*> out{&router, &gate_proj, &up_proj, &down_proj};
  if (Fs_ > 0) out.insert(out.end(), {&sh_gate, &sh_up, &sh_down});
  if (has_shared_gate_) out.push_back(&sh_gate_w);
  return out;
}

// Router, softmax, top-k and the grouping of the picks by expert (token order inside an expert).
template <class T>
void MoeMlp<T>::route(MoeActs<T>& a, const T* x, int64_t n) {
  resize_buffer(a.probs, n * E_);
  resize_buffer(a.pick, n * K_);
  resize_buffer(a.weight, n * K_);
  linear_forward<T>(x, router.w.data(), a.probs.data(), n, D_, E_);  // logits [n, E]
  std::vector<int32_t> order(static_cast<size_t>(E_));
  for (int64_t t = 0; t < n; ++t) {
    T* p = a.probs.data() + t * E_;
    const T mx = *std::max_element(p, p + E_);
    double sum = 0;
    for (int64_t e = 0; e < E_; ++e) sum += static_cast<double>(p[e] = std::exp(p[e] - mx));
    const T inv = static_cast<T>(1.0 / sum);
    for (int64_t e = 0; e < E_; ++e) p[e] *= inv;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + K_, order.end(),
                      [p](int32_t i, int32_t j) { return p[i] > p[j] || (p[i] == p[j] && i < j); });
    double s = 0;
    for (int64_t j = 0; j < K_; ++j) s += static_cast<double>(p[order[static_cast<size_t>(j)]]);
    for (int64_t j = 0; j < K_; ++j) {
      const int32_t e = order[static_cast<size_t>(j)];
      a.pick[t * K_ + j] = e;
      a.weight[t * K_ + j] = renorm_ ? static_cast<T>(static_cast<double>(p[e]) / s) : p[e];
    }
  }
  // Group the n * k picks by expert: first[e] .. first[e + 1] are expert e's rows.
  a.first.assign(static_cast<size_t>(E_ + 1), 0);
  for (int64_t i = 0; i < n * K_; ++i) ++a.first[static_cast<size_t>(a.pick[i]) + 1];
  for (int64_t e = 0; e < E_; ++e) a.first[e + 1] += a.first[e];
  std::vector<int64_t> next(a.first.begin(), a.first.end() - 1);
  resize_buffer(a.row_token, n * K_);
  resize_buffer(a.row_pick, n * K_);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < K_; ++j) {
      const int64_t r = next[static_cast<size_t>(a.pick[t * K_ + j])]++;
      a.row_token[r] = static_cast<int32_t>(t);
      a.row_pick[r] = static_cast<int32_t>(j);
    }
}

// a.g, a.u, a.h [Rows, Fl] and yrows [Rows, D] = down_e(silu(gate_e x) * up_e x) of the rows a.xg
// [Rows, D] grouped by expert (expert e: rows [first[e], first[e + 1]), e < experts), over this rank's
// Fl columns of each expert's width (all F of it without expert parallelism).
template <class T>
void MoeMlp<T>::experts_swiglu_forward(MoeActs<T>& a, const std::vector<int64_t>& first, int64_t experts, T* yrows) {
  const int64_t rows = first[static_cast<size_t>(experts)];
  resize_buffer(a.g, rows * Fl_);
  resize_buffer(a.u, rows * Fl_);
  resize_buffer(a.h, rows * Fl_);
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t r0 = first[static_cast<size_t>(e)], ne = first[static_cast<size_t>(e) + 1] - r0;
    if (ne == 0) continue;
    const T* xe = a.xg.data() + r0 * D_;
    T *ge = a.g.data() + r0 * Fl_, *ue = a.u.data() + r0 * Fl_, *he = a.h.data() + r0 * Fl_;
    linear_forward<T>(xe, gate_proj.w.data() + e * Fl_ * D_, ge, ne, D_, Fl_);  // [ne, Fl]
    linear_forward<T>(xe, up_proj.w.data() + e * Fl_ * D_, ue, ne, D_, Fl_);
    swiglu_forward<T>(ge, ue, he, ne * Fl_);
    linear_forward<T>(he, down_proj.w.data() + e * D_ * Fl_, yrows + r0 * D_, ne, Fl_, D_);  // [ne, D]
  }
}

template <class T>
void MoeMlp<T>::forward(int slot, const T* x, T* y, int64_t n, RouterTotals* totals) {
  MoeActs<T>& a = acts_[static_cast<size_t>(slot)];
  route(a, x, n);
  const int64_t R = n * K_;
  resize_buffer(a.xg, R * D_);
  resize_buffer(a.y, R * D_);
  for (int64_t r = 0; r < R; ++r) std::copy_n(x + a.row_token[r] * D_, D_, a.xg.data() + r * D_);
  experts_swiglu_forward(a, a.first, E_, a.y.data());
  std::fill(y, y + n * D_, T(0));
  for (int64_t r = 0; r < R; ++r) {  // rows grouped by expert: the sums in expert order
    const T w = a.weight[a.row_token[r] * K_ + a.row_pick[r]];
    T* yt = y + a.row_token[r] * D_;
    const T* yr = a.y.data() + r * D_;
    for (int64_t d = 0; d < D_; ++d) yt[d] += yr[d] * w;
  }
  if (Fs_ > 0) shared_forward(a, x, y, n);
  load_.resize(static_cast<size_t>(E_), 0);
  for (int64_t e = 0; e < E_; ++e) load_[e] += a.first[e + 1] - a.first[e];
  if (totals) {
    for (int64_t e = 0; e < E_; ++e) totals->count[e] += static_cast<double>(a.first[e + 1] - a.first[e]);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t e = 0; e < E_; ++e) totals->psum[e] += static_cast<double>(a.probs[t * E_ + e]);
    totals->rows += n;
  }
}

template <class T>
double MoeMlp<T>::take_load() {
  int64_t mx = 0, sum = 0;
  for (int64_t c : load_) {
    mx = std::max(mx, c);
    sum += c;
  }
  std::fill(load_.begin(), load_.end(), 0);
  return sum == 0 ? 0.0 : static_cast<double>(mx) * static_cast<double>(E_) / static_cast<double>(sum);
}

// y[n, D] += gate * down(silu(gate_proj x) * up_proj x); gate = sigmoid(x w_s^T) or 1.
template <class T>
void MoeMlp<T>::shared_forward(MoeActs<T>& a, const T* x, T* y, int64_t n) {
  shared_mlp_forward(a, x, n);
  shared_gate_forward(a, x, y, n);
}

// a.sg, a.su, a.sh [n, Fsl], a.sy [n, D] = down(silu(gate_proj x) * up_proj x) over this rank's Fsl
// columns of the shared width (all Fs of it without TP; with TP a.sy is a partial sum).
template <class T>
void MoeMlp<T>::shared_mlp_forward(MoeActs<T>& a, const T* x, int64_t n) {
  const int64_t F = Fsl_;
  resize_buffer(a.sg, n * F);
  resize_buffer(a.su, n * F);
  resize_buffer(a.sh, n * F);
  resize_buffer(a.sy, n * D_);
  linear_forward<T>(x, sh_gate.w.data(), a.sg.data(), n, D_, F);
  linear_forward<T>(x, sh_up.w.data(), a.su.data(), n, D_, F);
  swiglu_forward<T>(a.sg.data(), a.su.data(), a.sh.data(), n * F);
  linear_forward<T>(a.sh.data(), sh_down.w.data(), a.sy.data(), n, F, D_);
}

// a.sgate [n] = sigmoid(x w_s^T) (1 without the gate); y[n, D] += a.sgate * a.sy.
template <class T>
void MoeMlp<T>::shared_gate_forward(MoeActs<T>& a, const T* x, T* y, int64_t n) {
  resize_buffer(a.sgate, n);
  if (has_shared_gate_) {
    linear_forward<T>(x, sh_gate_w.w.data(), a.sgate.data(), n, D_, 1);
    for (int64_t t = 0; t < n; ++t) a.sgate[t] = T(1) / (T(1) + std::exp(-a.sgate[t]));
  } else {
    std::fill(a.sgate.begin(), a.sgate.end(), T(1));
  }
  for (int64_t t = 0; t < n; ++t)
    for (int64_t d = 0; d < D_; ++d) y[t * D_ + d] += a.sgate[t] * a.sy[t * D_ + d];
}

// dp[e] of token t: the routing weights' (w_j = p_e / S when renormalized, S the sum of the
// picked p: dp_e = (dw_j - sum_i dw_i w_i) / S; else dp_e = dw_j) plus aux_dp; then through the
// softmax: dlogits = p * (dp - sum_e p_e dp_e).
template <class T>
void MoeMlp<T>::router_grad(const MoeActs<T>& a, const T* dw, const T* aux_dp, T* dlogits, int64_t n) const {
  std::vector<double> dp(static_cast<size_t>(E_));
  for (int64_t t = 0; t < n; ++t) {
    const T* p = a.probs.data() + t * E_;
    for (int64_t e = 0; e < E_; ++e) dp[e] = aux_dp ? static_cast<double>(aux_dp[e]) : 0.0;
    const int32_t* pk = a.pick.data() + t * K_;
    const T* w = a.weight.data() + t * K_;
    const T* dwt = dw + t * K_;
    if (renorm_) {
      double s = 0, dot = 0;
      for (int64_t j = 0; j < K_; ++j) {
        s += static_cast<double>(p[pk[j]]);
        dot += static_cast<double>(dwt[j]) * static_cast<double>(w[j]);
      }
      for (int64_t j = 0; j < K_; ++j) dp[pk[j]] += (static_cast<double>(dwt[j]) - dot) / s;
    } else {
      for (int64_t j = 0; j < K_; ++j) dp[pk[j]] += static_cast<double>(dwt[j]);
    }
    double dot = 0;
    for (int64_t e = 0; e < E_; ++e) dot += static_cast<double>(p[e]) * dp[e];
    for (int64_t e = 0; e < E_; ++e) dlogits[t * E_ + e] = static_cast<T>(static_cast<double>(p[e]) * (dp[e] - dot));
  }
}

template <class T>
void MoeMlp<T>::backward(int slot, const T* x, const T* dy, T* dx, int64_t n, const T* aux_dp) {
  MoeActs<T>& a = acts_[static_cast<size_t>(slot)];
  resize_buffer(dw_, n * K_);
  resize_buffer(dlog_, n * E_);
  std::fill(dx, dx + n * D_, T(0));
  for (int64_t e = 0; e < E_; ++e) {
    const int64_t r0 = a.first[e], ne = a.first[e + 1] - r0;
    if (ne == 0) continue;
    resize_buffer(dye_, ne * D_);
    resize_buffer(dh_, ne * F_);
    resize_buffer(dg_, ne * F_);
    resize_buffer(du_, ne * F_);
    resize_buffer(dxg_, ne * D_);
    for (int64_t r = r0; r < r0 + ne; ++r) {  // dy_e = w * dy[t]; dw = dy[t] . y_e
      const int64_t t = a.row_token[r], j = a.row_pick[r];
      const T w = a.weight[t * K_ + j];
      const T* dyt = dy + t * D_;
      const T* yr = a.y.data() + r * D_;
      double dot = 0;
      for (int64_t d = 0; d < D_; ++d) {
        dye_[(r - r0) * D_ + d] = dyt[d] * w;
        dot += static_cast<double>(dyt[d]) * static_cast<double>(yr[d]);
      }
      dw_[t * K_ + j] = static_cast<T>(dot);
    }
    const T* xe = a.xg.data() + r0 * D_;
    const T *ge = a.g.data() + r0 * F_, *ue = a.u.data() + r0 * F_, *he = a.h.data() + r0 * F_;
    linear_backward<T>(he, down_proj.w.data() + e * D_ * F_, dye_.data(), dh_.data(), false,
                       down_proj.g.data() + e * D_ * F_, ne, F_, D_);
    swiglu_backward<T>(ge, ue, dh_.data(), dg_.data(), du_.data(), ne * F_);
    linear_backward<T>(xe, gate_proj.w.data() + e * F_ * D_, dg_.data(), dxg_.data(), false,
                       gate_proj.g.data() + e * F_ * D_, ne, D_, F_);
    linear_backward<T>(xe, up_proj.w.data() + e * F_ * D_, du_.data(), dxg_.data(), true,
                       up_proj.g.data() + e * F_ * D_, ne, D_, F_);
    for (int64_t r = r0; r < r0 + ne; ++r) {
      T* dxt = dx + a.row_token[r] * D_;
      const T* dr = dxg_.data() + (r - r0) * D_;
      for (int64_t d = 0; d < D_; ++d) dxt[d] += dr[d];
    }
  }
  if (Fs_ > 0) shared_backward(a, x, dy, dx, n);
  router_grad(a, dw_.data(), aux_dp, dlog_.data(), n);
  linear_backward<T>(x, router.w.data(), dlog_.data(), dx, true, router.g.data(), n, D_, E_);
}

template <class T>
void MoeMlp<T>::shared_backward(MoeActs<T>& a, const T* x, const T* dy, T* dx, int64_t n) {
  std::vector<T> dz;
  shared_gate_backward(a, x, dy, dx, n, &dz);
  shared_mlp_backward(a, x, dx, n);
}

// dye_ [n, D] = dy * gate (the MLP's output gradient); the gate's logit gradient dz [n] through
// sigmoid, its weight's gradient and its input gradient added to dx (Qwen2-MoE's gate).
template <class T>
void MoeMlp<T>::shared_gate_backward(const MoeActs<T>& a, const T* x, const T* dy, T* dx, int64_t n,
                                     std::vector<T>* dz) {
  resize_buffer(dye_, n * D_);
  dz->assign(static_cast<size_t>(n), T(0));
  for (int64_t t = 0; t < n; ++t) {
    double dot = 0;
    for (int64_t d = 0; d < D_; ++d) {
      dye_[t * D_ + d] = dy[t * D_ + d] * a.sgate[t];
      dot += static_cast<double>(dy[t * D_ + d]) * static_cast<double>(a.sy[t * D_ + d]);
    }
    const double s = static_cast<double>(a.sgate[t]);
    (*dz)[t] = static_cast<T>(dot * s * (1.0 - s));  // d sigmoid(z) / dz
  }
  if (has_shared_gate_) linear_backward<T>(x, sh_gate_w.w.data(), dz->data(), dx, true, sh_gate_w.g.data(), n, D_, 1);
}

// dxs [n, D] += the MLP's input gradient for dye_ over this rank's Fsl columns (a partial sum with
// TP); the gradients of its weights accumulate.
template <class T>
void MoeMlp<T>::shared_mlp_backward(const MoeActs<T>& a, const T* x, T* dxs, int64_t n) {
  const int64_t F = Fsl_;
  resize_buffer(dh_, n * F);
  resize_buffer(dg_, n * F);
  resize_buffer(du_, n * F);
  linear_backward<T>(a.sh.data(), sh_down.w.data(), dye_.data(), dh_.data(), false, sh_down.g.data(), n, F, D_);
  swiglu_backward<T>(a.sg.data(), a.su.data(), dh_.data(), dg_.data(), du_.data(), n * F);
  linear_backward<T>(x, sh_gate.w.data(), dg_.data(), dxs, true, sh_gate.g.data(), n, D_, F);
  linear_backward<T>(x, sh_up.w.data(), du_.data(), dxs, true, sh_up.g.data(), n, D_, F);
}

template class MoeMlp<float>;
template class MoeMlp<double>;

}  // namespace ckpt::trainer
