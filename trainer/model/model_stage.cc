// Model<T>: the forward and backward of a pipeline stage (per activation slot), and the
// one-process forward / forward_backward on top of them (slot 0).
#include <algorithm>
#include <cstring>

#include "trainer/model/model.h"
#include "trainer/model/ops.h"

namespace ckpt::trainer {

namespace {
// The router totals of a forward boundary message: count[E], psum[E] (float64), rows (int64).
int64_t router_tail_bytes(int64_t experts) { return (2 * experts + 1) * 8; }

void pack_router_totals(const RouterTotals& r, void* dst) {
  char* p = static_cast<char*>(dst);
  const size_t e = r.count.size() * sizeof(double);
  std::memcpy(p, r.count.data(), e);
  std::memcpy(p + e, r.psum.data(), e);
  std::memcpy(p + 2 * e, &r.rows, sizeof(r.rows));
}

// Into r (already reset to E experts).
void unpack_router_totals(const void* src, RouterTotals* r) {
  const char* p = static_cast<const char*>(src);
  const size_t e = r->count.size() * sizeof(double);
  std::memcpy(r->count.data(), p, e);
  std::memcpy(r->psum.data(), p + e, e);
  std::memcpy(&r->rows, p + 2 * e, sizeof(r->rows));
}
}  // namespace

template <class T>
int64_t Model<T>::forward_tail() const {
  if (!cfg_.moe) return 0;
  const int64_t bytes = router_tail_bytes(cfg_.moe->num_experts), t = static_cast<int64_t>(sizeof(T));
  return (bytes + t - 1) / t;
}

template <class T>
int64_t Model<T>::backward_tail() const {
  return cfg_.moe ? cfg_.moe->num_experts : 0;
}

template <class T>
void Model<T>::ensure_rope(int64_t seq) {
  if (rope_seq_ == seq) return;
  rope_tables<T>(seq, cfg_.head_dim, cfg_.rope_theta, cos_, sin_);
  rope_seq_ = seq;
}

template <class T>
Status Model<T>::tp_sum(T* buf, int64_t n) {
  if (!tp_.comm || tp_.size == 1) return Status::Ok();
  return tp_.comm->all_reduce_sum<T>(buf, n);
}

template <class T>
Result<double> Model<T>::run_forward(int slot, const int32_t* tokens, const T* x_in, const int32_t* targets,
                                     int64_t b, int64_t seq, T loss_scale, T* x_out, bool grads) {
  SlotActs& s = slots_[static_cast<size_t>(slot)];
  s.live = false;
  s.b = b;
  s.seq = seq;
  const int64_t n = b * seq, D = cfg_.hidden_size, nl = static_cast<int64_t>(layers_.size());
  ensure_rope(seq);
  // Boundaries 0..nl of the residual stream; a stage before the last writes its output to x_out.
  resize_buffer(s.resid, (has_head() ? nl + 1 : nl) * n * D);
  T* x = s.resid.data();
  if (has_embedding()) {
    s.tokens.assign(tokens, tokens + n);
    CKPT_RETURN_IF_ERROR(vocab_parallel_embedding<T>(embed_.w.data(), vocab_, tokens, n, D, x, tp_.comm));
  } else {
    std::copy(x_in, x_in + n * D, x);
  }
  if (cfg_.moe) {  // the totals start at the first stage, later ones continue those of the stages before
    s.router.reset(cfg_.moe->num_experts);
    if (!has_embedding()) unpack_router_totals(x_in + n * D, &s.router);
  }
  for (int64_t i = 0; i < nl; ++i) {
    T* out = (i + 1 == nl && !has_head()) ? x_out : x + (i + 1) * n * D;
    CKPT_RETURN_IF_ERROR(layers_[static_cast<size_t>(i)].forward(slot, x + i * n * D, out, b, seq, cos_.data(),
                                                                 sin_.data(), &s.router));
  }
  if (!has_head()) {
    if (cfg_.moe) pack_router_totals(s.router, x_out + n * D);
    s.live = grads;
    return 0.0;
  }
  const int64_t Vl = vocab_.size();
  resize_buffer(s.xf, n * D);
  resize_buffer(s.rstdf, n);
  resize_buffer(s.logits, n * Vl);
  rmsnorm_forward<T>(x + nl * n * D, norm_.w.data(), s.xf.data(), s.rstdf.data(), n, D, cfg_.rms_norm_eps);
  if (Vl > 0) linear_forward<T>(s.xf.data(), head().w.data(), s.logits.data(), n, D, Vl);
  double loss = 0;
  if (targets) {
    CKPT_ASSIGN_OR_RETURN(loss, vocab_parallel_cross_entropy<T>(s.logits.data(), vocab_, targets,
                                                                grads ? s.logits.data() : nullptr, n,
                                                                loss_scale, tp_.comm));
    loss += moe_aux(s, loss_scale);
  }
  s.live = grads;
  return loss;
}

// The load-balancing loss of the slot's micro-batch (on the last stage, from the totals of every
// stage's MoE layers), as a sum over its n tokens: coef * aux * n, so that the step's mean loss is
// transformers' loss + router_aux_loss_coef * aux_loss. Keeps d(loss_scale * that)/d(p[t, e]) =
// loss_scale * n * coef * E * count_e / rows^2 for the backward (rows = n x MoE layers).
template <class T>
double Model<T>::moe_aux(SlotActs& s, T loss_scale) {
  s.aux_dp.clear();
  last_aux_ = 0;
  if (!cfg_.moe) return 0.0;
  if (s.router.rows == 0) {  // no MoE layer at all: nothing to pass back but zeros
    s.aux_dp.assign(static_cast<size_t>(cfg_.moe->num_experts), T(0));
    return 0.0;
  }
  last_aux_ = s.router.aux_loss();
  const double n = static_cast<double>(s.b * s.seq), rows = static_cast<double>(s.router.rows);
  const double E = static_cast<double>(cfg_.moe->num_experts);
  s.aux_dp.resize(s.router.count.size());
  for (size_t e = 0; e < s.aux_dp.size(); ++e)
    s.aux_dp[e] = static_cast<T>(static_cast<double>(loss_scale) * n * aux_coef_ * E * s.router.count[e] / (rows * rows));
  return aux_coef_ * last_aux_ * n;
}

template <class T>
Result<double> Model<T>::stage_forward(int slot, const int32_t* tokens, const T* x_in, const int32_t* targets,
                                       int64_t b, int64_t seq, T loss_scale, T* x_out) {
  CKPT_RETURN_IF_ERROR(check_stage_call(slot, tokens, x_in, targets, b, seq, x_out));
  return run_forward(slot, tokens, x_in, targets, b, seq, loss_scale, x_out, true);
}

template <class T>
Status Model<T>::head_backward(SlotActs& s, T* dx) {
  const int64_t n = s.b * s.seq, D = cfg_.hidden_size, Vl = vocab_.size();
  const T* xl = s.resid.data() + static_cast<int64_t>(layers_.size()) * n * D;
  resize_buffer(ws_.dxn, n * D);
  Param<T>& h = head();
  if (Vl > 0)
    linear_backward<T>(s.xf.data(), h.w.data(), s.logits.data(), ws_.dxn.data(), false, h.g.data(), n, D, Vl);
  else
    std::fill(ws_.dxn.begin(), ws_.dxn.end(), T(0));
  CKPT_RETURN_IF_ERROR(tp_sum(ws_.dxn.data(), n * D));  // the head's input gradient, summed over TP
  std::fill(dx, dx + n * D, T(0));
  rmsnorm_backward<T>(xl, norm_.w.data(), s.rstdf.data(), ws_.dxn.data(), dx, norm_.g.data(), n, D);
  return Status::Ok();
}

template <class T>
Status Model<T>::stage_backward(int slot, const T* dx_out, T* dx_in) {
  if (slot < 0 || slot >= static_cast<int>(slots_.size()) || !slots_[static_cast<size_t>(slot)].live)
    return Status::InvalidArgument("stage_backward: activation slot " + std::to_string(slot) +
                                   " holds no micro-batch (stage_forward first)");
  if ((!has_head() && !dx_out) || (!has_embedding() && !dx_in))
    return Status::InvalidArgument("stage_backward: missing dx_out or dx_in buffer");
  SlotActs& s = slots_[static_cast<size_t>(slot)];
  s.live = false;
  const int64_t n = s.b * s.seq, D = cfg_.hidden_size;
  ensure_rope(s.seq);
  resize_buffer(ws_.dres0, n * D);
  resize_buffer(ws_.dres1, n * D);
  const T* g = dx_out;
  const int64_t E = backward_tail();
  if (E > 0 && !has_head()) s.aux_dp.assign(dx_out + n * D, dx_out + n * D + E);  // from the last stage
  if (has_head()) {
    CKPT_RETURN_IF_ERROR(head_backward(s, ws_.dres0.data()));
    g = ws_.dres0.data();
  }
  for (int64_t i = static_cast<int64_t>(layers_.size()) - 1; i >= 0; --i) {
    T* out = (g == ws_.dres0.data()) ? ws_.dres1.data() : ws_.dres0.data();
    if (i == 0 && !has_embedding()) out = dx_in;
    CKPT_RETURN_IF_ERROR(layers_[static_cast<size_t>(i)].backward(slot, s.resid.data() + i * n * D, g, out, s.b,
                                                                  s.seq, ws_, cos_.data(), sin_.data(),
                                                                  s.aux_dp.empty() ? nullptr : s.aux_dp.data()));
    g = out;
  }
  if (E > 0 && !has_embedding()) std::copy(s.aux_dp.begin(), s.aux_dp.end(), dx_in + n * D);  // to the stage before
  if (has_embedding()) vocab_parallel_embedding_backward<T>(embed_.g.data(), vocab_, s.tokens.data(), n, D, g);
  return Status::Ok();
}

template <class T>
Result<double> Model<T>::forward(const int32_t* tokens, const int32_t* targets, int64_t b, int64_t seq,
                                 std::vector<T>* logits) {
  CKPT_RETURN_IF_ERROR(check_batch(tokens, targets, b, seq));
  CKPT_ASSIGN_OR_RETURN(double loss, run_forward(0, tokens, nullptr, targets, b, seq, T(1), nullptr, false));
  if (logits) *logits = slots_[0].logits;
  return loss;
}

template <class T>
Result<double> Model<T>::forward_backward(const int32_t* tokens, const int32_t* targets, int64_t b,
                                          int64_t seq, T loss_scale) {
  CKPT_RETURN_IF_ERROR(check_batch(tokens, targets, b, seq));
  if (!targets) return Status::InvalidArgument("forward_backward needs targets");
  CKPT_ASSIGN_OR_RETURN(double loss, run_forward(0, tokens, nullptr, targets, b, seq, loss_scale, nullptr, true));
  CKPT_RETURN_IF_ERROR(stage_backward(0, nullptr, nullptr));
  return loss;
}

// The members defined here (Model<T> itself is instantiated in model.cc).
#define CKPT_INSTANTIATE_STAGE(T)                                                                          \
  template void Model<T>::ensure_rope(int64_t);                                                             \
  template int64_t Model<T>::forward_tail() const;                                                          \
  template int64_t Model<T>::backward_tail() const;                                                         \
  template Status Model<T>::tp_sum(T*, int64_t);                                                            \
  template Result<double> Model<T>::run_forward(int, const int32_t*, const T*, const int32_t*, int64_t,     \
                                                int64_t, T, T*, bool);                                      \
  template Result<double> Model<T>::stage_forward(int, const int32_t*, const T*, const int32_t*, int64_t,   \
                                                  int64_t, T, T*);                                          \
  template Status Model<T>::head_backward(SlotActs&, T*);                                                   \
  template double Model<T>::moe_aux(SlotActs&, T);                                                   \
  template Status Model<T>::stage_backward(int, const T*, T*);                                              \
  template Result<double> Model<T>::forward(const int32_t*, const int32_t*, int64_t, int64_t,               \
                                            std::vector<T>*);                                               \
  template Result<double> Model<T>::forward_backward(const int32_t*, const int32_t*, int64_t, int64_t, T);
CKPT_INSTANTIATE_STAGE(float)
CKPT_INSTANTIATE_STAGE(double)
#undef CKPT_INSTANTIATE_STAGE

}  // namespace ckpt::trainer
