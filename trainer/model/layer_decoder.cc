#include "trainer/model/layer_decoder.h"

#include <algorithm>
#include <utility>

#include "trainer/model/ops.h"

namespace ckpt::trainer {

template <class T>
void Param<T>::allocate(std::string n, Shape s, bool wd) {
  Box b = Box::whole(s);
  allocate(std::move(n), std::move(s), std::move(b), wd);
}

template <class T>
void Param<T>::allocate(std::string n, Shape s, Box b, bool wd) {
  name = std::move(n);
  shape = std::move(s);
  box = std::move(b);
  decay = wd;
  const int64_t cnt = box.numel();  // validated by Model::create
  w.assign(static_cast<size_t>(cnt), T(0));
  g.assign(static_cast<size_t>(cnt), T(0));
}

template <class T>
std::vector<std::vector<std::pair<std::string, Shape>>> DecoderLayer<T>::layer_specs(const LlamaConfig& c) {
  std::vector<std::vector<std::pair<std::string, Shape>>> out(static_cast<size_t>(c.num_hidden_layers));
  for (auto& t : llama_model_tensors(c, DType::kF32)) {
    const int64_t l = llama_layer_of(t.name);
    if (l >= 0 && l < c.num_hidden_layers) out[static_cast<size_t>(l)].emplace_back(std::move(t.name), std::move(t.shape));
  }
  return out;
}

template <class T>
std::vector<std::pair<std::string, Shape>> DecoderLayer<T>::param_specs(const LlamaConfig& c, int64_t index) {
  return layer_specs(c)[static_cast<size_t>(index)];
}

template <class T>
DecoderLayer<T>::DecoderLayer(const LlamaConfig& c, int64_t index, TpPart tp, const std::vector<Box>& boxes,
                              const std::vector<std::pair<std::string, Shape>>& specs)
    : index_(index),
      D_(c.hidden_size),
      Fl_(c.intermediate_size / tp.size),
      Hl_(c.num_attention_heads / tp.size),
      Kl_(c.num_key_value_heads / tp.size),
      hd_(c.head_dim),
      eps_(c.rms_norm_eps),
      qkv_bias_(c.qkv_bias),
      qk_norm_(c.qk_norm),
      tp_(tp) {
  if (c.moe && c.moe->is_moe_layer(index)) {
    std::vector<std::pair<std::string, Shape>> mlp;
    for (const auto& sp : specs)
      if (sp.first.find(".mlp.") != std::string::npos) mlp.push_back(sp);
    moe = MoeMlp<T>(c, mlp);
  }
  const auto ps = params();  // canonical order, as specs (Model::create checked the config)
  for (size_t i = 0; i < ps.size() && i < specs.size(); ++i) {
    if (!ps[i]->name.empty()) continue;  // the MoE MLP's, allocated whole
    const bool norm = llama_is_norm(specs[i].first), bias = specs[i].first.ends_with(".bias");
    ps[i]->allocate(specs[i].first, specs[i].second, boxes[i], !norm && !bias);
    ps[i]->tp_replicated = norm && tp.size > 1;
  }
  acts_.resize(1);
}

template <class T>
void DecoderLayer<T>::set_slots(int k) {
  acts_.resize(static_cast<size_t>(k));
  moe.set_slots(k);
}

template <class T>
std::vector<Param<T>*> DecoderLayer<T>::params() {
  std::vector<Param<T>*> out{&input_layernorm, &q_proj};
  if (qkv_bias_) out.push_back(&q_bias);
  out.push_back(&k_proj);
  if (qkv_bias_) out.push_back(&k_bias);
  out.push_back(&v_proj);
  if (qkv_bias_) out.push_back(&v_bias);
  out.push_back(&o_proj);
  if (qk_norm_) out.insert(out.end(), {&q_norm, &k_norm});
  out.push_back(&post_attention_layernorm);
  if (moe.active()) {
    for (auto* p : moe.params()) out.push_back(p);
  } else {
    out.insert(out.end(), {&gate_proj, &up_proj, &down_proj});
  }
  return out;
}

template <class T>
Status DecoderLayer<T>::tp_sum(T* buf, int64_t n) {
  if (!tp_.comm || tp_.size == 1) return Status::Ok();
  return tp_.comm->all_reduce_sum<T>(buf, n);
}

template <class T>
void DecoderLayer<T>::qkv_forward(LayerActs<T>& a, int64_t n, int64_t seq, const T* cos, const T* sin) {
  const int64_t Q = Hl_ * hd_, KV = Kl_ * hd_;
  linear_forward<T>(a.xn1.data(), q_proj.w.data(), a.q.data(), n, D_, Q);
  linear_forward<T>(a.xn1.data(), k_proj.w.data(), a.k.data(), n, D_, KV);
  linear_forward<T>(a.xn1.data(), v_proj.w.data(), a.v.data(), n, D_, KV);
  if (qkv_bias_) {
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t j = 0; j < Q; ++j) a.q[r * Q + j] += q_bias.w[j];
      for (int64_t j = 0; j < KV; ++j) a.k[r * KV + j] += k_bias.w[j];
      for (int64_t j = 0; j < KV; ++j) a.v[r * KV + j] += v_bias.w[j];
    }
  }
  if (qk_norm_) {  // RMSNorm of each head's [hd] vector: rows [n*Hl, hd], [n*Kl, hd]
    a.q_raw = a.q;
    a.k_raw = a.k;
    resize_buffer(a.rstd_q, n * Hl_);
    resize_buffer(a.rstd_k, n * Kl_);
    rmsnorm_forward<T>(a.q_raw.data(), q_norm.w.data(), a.q.data(), a.rstd_q.data(), n * Hl_, hd_, eps_);
    rmsnorm_forward<T>(a.k_raw.data(), k_norm.w.data(), a.k.data(), a.rstd_k.data(), n * Kl_, hd_, eps_);
  }
  rope_apply<T>(a.q.data(), n, seq, Hl_, hd_, cos, sin, false);
  rope_apply<T>(a.k.data(), n, seq, Kl_, hd_, cos, sin, false);
}

template <class T>
Status DecoderLayer<T>::forward(int slot, const T* x_in, T* x_out, int64_t b, int64_t seq, const T* cos,
                                const T* sin, RouterTotals* totals) {
  LayerActs<T>& a = acts_[static_cast<size_t>(slot)];
  const int64_t n = b * seq, Q = Hl_ * hd_, KV = Kl_ * hd_, Fa = moe.active() ? 0 : Fl_;
  resize_buffer(a.xn1, n * D_);
  resize_buffer(a.rstd1, n);
  resize_buffer(a.q, n * Q);
  resize_buffer(a.k, n * KV);
  resize_buffer(a.v, n * KV);
  resize_buffer(a.probs, b * Hl_ * seq * seq);
  resize_buffer(a.att, n * Q);
  resize_buffer(a.x_mid, n * D_);
  resize_buffer(a.xn2, n * D_);
  resize_buffer(a.rstd2, n);
  resize_buffer(a.g, n * Fa);
  resize_buffer(a.u, n * Fa);
  resize_buffer(a.h, n * Fa);

  rmsnorm_forward<T>(x_in, input_layernorm.w.data(), a.xn1.data(), a.rstd1.data(), n, D_, eps_);
  qkv_forward(a, n, seq, cos, sin);
  attention_forward<T>(a.q.data(), a.k.data(), a.v.data(), a.probs.data(), a.att.data(), b, seq, Hl_, Kl_,
                       hd_);
  // x_mid = x_in + sum over TP of o_proj(att) (row-parallel)
  linear_forward<T>(a.att.data(), o_proj.w.data(), a.x_mid.data(), n, Q, D_);
  CKPT_RETURN_IF_ERROR(tp_sum(a.x_mid.data(), n * D_));
  for (int64_t i = 0; i < n * D_; ++i) a.x_mid[i] += x_in[i];
  rmsnorm_forward<T>(a.x_mid.data(), post_attention_layernorm.w.data(), a.xn2.data(), a.rstd2.data(), n, D_,
                     eps_);
  if (moe.active()) {
    moe.forward(slot, a.xn2.data(), x_out, n, totals);
  } else {
    linear_forward<T>(a.xn2.data(), gate_proj.w.data(), a.g.data(), n, D_, Fl_);
    linear_forward<T>(a.xn2.data(), up_proj.w.data(), a.u.data(), n, D_, Fl_);
    swiglu_forward<T>(a.g.data(), a.u.data(), a.h.data(), n * Fl_);
    // x_out = x_mid + sum over TP of down_proj(h) (row-parallel)
    linear_forward<T>(a.h.data(), down_proj.w.data(), x_out, n, Fl_, D_);
    CKPT_RETURN_IF_ERROR(tp_sum(x_out, n * D_));
  }
  for (int64_t i = 0; i < n * D_; ++i) x_out[i] += a.x_mid[i];
  return Status::Ok();
}

namespace {
// bias_g[m] += sum over rows of dy[n, m].
template <class T>
void decoder_bias_grad(const T* dy, T* bias_g, int64_t n, int64_t m) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < m; ++j) bias_g[j] += dy[r * m + j];
}
}  // namespace

template <class T>
Status DecoderLayer<T>::qkv_backward(LayerActs<T>& a, int64_t n, int64_t seq, Workspace<T>& ws, const T* cos,
                                     const T* sin) {
  const int64_t Q = Hl_ * hd_, KV = Kl_ * hd_;
  rope_apply<T>(ws.dq.data(), n, seq, Hl_, hd_, cos, sin, true);
  rope_apply<T>(ws.dk.data(), n, seq, Kl_, hd_, cos, sin, true);
  T* dq = ws.dq.data();
  T* dk = ws.dk.data();
  if (qk_norm_) {  // through the per-head norms; ws.datt is free after the attention backward
    resize_buffer(ws.dkn, n * KV);
    std::fill(ws.datt.begin(), ws.datt.end(), T(0));
    std::fill(ws.dkn.begin(), ws.dkn.end(), T(0));
    // With tp > 1 each rank's norm gradient sums over its own heads only: the partial sums of
    // this micro-batch are added up over TP (one [2 hd] all-reduce), so that the replicated
    // weights get the same gradient on every TP rank (the replica sums count them once).
    const bool split = tp_.size > 1;
    if (split) ws.dqk_norm.assign(static_cast<size_t>(2 * hd_), T(0));
    T* gq = split ? ws.dqk_norm.data() : q_norm.g.data();
    T* gk = split ? ws.dqk_norm.data() + hd_ : k_norm.g.data();
    rmsnorm_backward<T>(a.q_raw.data(), q_norm.w.data(), a.rstd_q.data(), dq, ws.datt.data(), gq, n * Hl_, hd_);
    rmsnorm_backward<T>(a.k_raw.data(), k_norm.w.data(), a.rstd_k.data(), dk, ws.dkn.data(), gk, n * Kl_, hd_);
    if (split) {
      CKPT_RETURN_IF_ERROR(tp_sum(ws.dqk_norm.data(), 2 * hd_));
      for (int64_t j = 0; j < hd_; ++j) q_norm.g[j] += gq[j], k_norm.g[j] += gk[j];
    }
    dq = ws.datt.data();
    dk = ws.dkn.data();
  }
  if (qkv_bias_) {
    decoder_bias_grad<T>(dq, q_bias.g.data(), n, Q);
    decoder_bias_grad<T>(dk, k_bias.g.data(), n, KV);
    decoder_bias_grad<T>(ws.dv.data(), v_bias.g.data(), n, KV);
  }
  linear_backward<T>(a.xn1.data(), q_proj.w.data(), dq, ws.dxn.data(), false, q_proj.g.data(), n, D_, Q);
  linear_backward<T>(a.xn1.data(), k_proj.w.data(), dk, ws.dxn.data(), true, k_proj.g.data(), n, D_, KV);
  linear_backward<T>(a.xn1.data(), v_proj.w.data(), ws.dv.data(), ws.dxn.data(), true, v_proj.g.data(), n, D_,
                     KV);
  return Status::Ok();
}

template <class T>
Status DecoderLayer<T>::backward(int slot, const T* x_in, const T* dx_out, T* dx_in, int64_t b, int64_t seq,
                                 Workspace<T>& ws, const T* cos, const T* sin, const T* aux_dp) {
  LayerActs<T>& a = acts_[static_cast<size_t>(slot)];
  const int64_t n = b * seq, Q = Hl_ * hd_, KV = Kl_ * hd_;
  resize_buffer(ws.dh, n * Fl_);
  resize_buffer(ws.dg, n * Fl_);
  resize_buffer(ws.du, n * Fl_);
  resize_buffer(ws.dxn, n * D_);
  resize_buffer(ws.datt, n * Q);
  resize_buffer(ws.dq, n * Q);
  resize_buffer(ws.dk, n * KV);
  resize_buffer(ws.dv, n * KV);
  resize_buffer(ws.dscores, seq * seq);

  if (moe.active()) {
    moe.backward(slot, a.xn2.data(), dx_out, ws.dxn.data(), n, aux_dp);
  } else {
    // MLP: x_out = x_mid + down(h); h = silu(g) * u; g = gate(xn2); u = up(xn2)
    linear_backward<T>(a.h.data(), down_proj.w.data(), dx_out, ws.dh.data(), false, down_proj.g.data(), n, Fl_,
                       D_);
    swiglu_backward<T>(a.g.data(), a.u.data(), ws.dh.data(), ws.dg.data(), ws.du.data(), n * Fl_);
    linear_backward<T>(a.xn2.data(), gate_proj.w.data(), ws.dg.data(), ws.dxn.data(), false,
                       gate_proj.g.data(), n, D_, Fl_);
    linear_backward<T>(a.xn2.data(), up_proj.w.data(), ws.du.data(), ws.dxn.data(), true, up_proj.g.data(), n,
                       D_, Fl_);
    CKPT_RETURN_IF_ERROR(tp_sum(ws.dxn.data(), n * D_));  // column-parallel input gradient
  }
  // dx_mid (kept in dx_in) = dx_out + rmsnorm backward
  std::copy(dx_out, dx_out + n * D_, dx_in);
  rmsnorm_backward<T>(a.x_mid.data(), post_attention_layernorm.w.data(), a.rstd2.data(), ws.dxn.data(), dx_in,
                      post_attention_layernorm.g.data(), n, D_);
  // Attention: x_mid = x_in + o(att)
  linear_backward<T>(a.att.data(), o_proj.w.data(), dx_in, ws.datt.data(), false, o_proj.g.data(), n, Q, D_);
  attention_backward<T>(a.q.data(), a.k.data(), a.v.data(), a.probs.data(), ws.datt.data(), ws.dq.data(),
                        ws.dk.data(), ws.dv.data(), ws.dscores.data(), b, seq, Hl_, Kl_, hd_);
  CKPT_RETURN_IF_ERROR(qkv_backward(a, n, seq, ws, cos, sin));
  CKPT_RETURN_IF_ERROR(tp_sum(ws.dxn.data(), n * D_));  // column-parallel input gradient
  // dx_in = dx_mid + rmsnorm backward (accumulates into dx_in)
  rmsnorm_backward<T>(x_in, input_layernorm.w.data(), a.rstd1.data(), ws.dxn.data(), dx_in,
                      input_layernorm.g.data(), n, D_);
  return Status::Ok();
}

template struct Param<float>;
template struct Param<double>;
template class DecoderLayer<float>;
template class DecoderLayer<double>;

}  // namespace ckpt::trainer
