#include "trainer/model/layer_decoder.h"

#include <algorithm>

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
std::vector<std::pair<std::string, Shape>> DecoderLayer<T>::param_specs(const LlamaConfig& c, int64_t index) {
  const std::string p = "model.layers." + std::to_string(index) + ".";
  const int64_t D = c.hidden_size, F = c.intermediate_size, Q = c.num_attention_heads * c.head_dim,
                KV = c.num_key_value_heads * c.head_dim;
  return {{p + "input_layernorm.weight", {D}},       {p + "self_attn.q_proj.weight", {Q, D}},
          {p + "self_attn.k_proj.weight", {KV, D}},  {p + "self_attn.v_proj.weight", {KV, D}},
          {p + "self_attn.o_proj.weight", {D, Q}},   {p + "post_attention_layernorm.weight", {D}},
          {p + "mlp.gate_proj.weight", {F, D}},      {p + "mlp.up_proj.weight", {F, D}},
          {p + "mlp.down_proj.weight", {D, F}}};
}

template <class T>
DecoderLayer<T>::DecoderLayer(const LlamaConfig& c, int64_t index, TpPart tp, const std::vector<Box>& boxes)
    : index_(index),
      D_(c.hidden_size),
      Fl_(c.intermediate_size / tp.size),
      Hl_(c.num_attention_heads / tp.size),
      Kl_(c.num_key_value_heads / tp.size),
      hd_(c.head_dim),
      eps_(c.rms_norm_eps),
      tp_(tp) {
  const auto specs = param_specs(c, index);
  const auto ps = params();
  for (size_t i = 0; i < ps.size(); ++i) {
    const bool norm = (i == 0 || i == 5);
    ps[i]->allocate(specs[i].first, specs[i].second, boxes[i], !norm);
    ps[i]->tp_replicated = norm && tp.size > 1;
  }
  acts_.resize(1);
}

template <class T>
std::vector<Param<T>*> DecoderLayer<T>::params() {
  return {&input_layernorm, &q_proj, &k_proj, &v_proj, &o_proj,
          &post_attention_layernorm, &gate_proj, &up_proj, &down_proj};
}

template <class T>
Status DecoderLayer<T>::tp_sum(T* buf, int64_t n) {
  if (!tp_.comm || tp_.size == 1) return Status::Ok();
  return tp_.comm->all_reduce_sum<T>(buf, n);
}

template <class T>
Status DecoderLayer<T>::forward(int slot, const T* x_in, T* x_out, int64_t b, int64_t seq, const T* cos,
                                const T* sin) {
  LayerActs<T>& a = acts_[static_cast<size_t>(slot)];
  const int64_t n = b * seq, Q = Hl_ * hd_, KV = Kl_ * hd_;
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
  resize_buffer(a.g, n * Fl_);
  resize_buffer(a.u, n * Fl_);
  resize_buffer(a.h, n * Fl_);

  rmsnorm_forward<T>(x_in, input_layernorm.w.data(), a.xn1.data(), a.rstd1.data(), n, D_, eps_);
  linear_forward<T>(a.xn1.data(), q_proj.w.data(), a.q.data(), n, D_, Q);
  linear_forward<T>(a.xn1.data(), k_proj.w.data(), a.k.data(), n, D_, KV);
  linear_forward<T>(a.xn1.data(), v_proj.w.data(), a.v.data(), n, D_, KV);
  rope_apply<T>(a.q.data(), n, seq, Hl_, hd_, cos, sin, false);
  rope_apply<T>(a.k.data(), n, seq, Kl_, hd_, cos, sin, false);
  attention_forward<T>(a.q.data(), a.k.data(), a.v.data(), a.probs.data(), a.att.data(), b, seq, Hl_, Kl_,
                       hd_);
  // x_mid = x_in + sum over TP of o_proj(att) (row-parallel)
  linear_forward<T>(a.att.data(), o_proj.w.data(), a.x_mid.data(), n, Q, D_);
  CKPT_RETURN_IF_ERROR(tp_sum(a.x_mid.data(), n * D_));
  for (int64_t i = 0; i < n * D_; ++i) a.x_mid[i] += x_in[i];
  rmsnorm_forward<T>(a.x_mid.data(), post_attention_layernorm.w.data(), a.xn2.data(), a.rstd2.data(), n, D_,
                     eps_);
  linear_forward<T>(a.xn2.data(), gate_proj.w.data(), a.g.data(), n, D_, Fl_);
  linear_forward<T>(a.xn2.data(), up_proj.w.data(), a.u.data(), n, D_, Fl_);
  swiglu_forward<T>(a.g.data(), a.u.data(), a.h.data(), n * Fl_);
  // x_out = x_mid + sum over TP of down_proj(h) (row-parallel)
  linear_forward<T>(a.h.data(), down_proj.w.data(), x_out, n, Fl_, D_);
  CKPT_RETURN_IF_ERROR(tp_sum(x_out, n * D_));
  for (int64_t i = 0; i < n * D_; ++i) x_out[i] += a.x_mid[i];
  return Status::Ok();
}

template <class T>
Status DecoderLayer<T>::backward(int slot, const T* x_in, const T* dx_out, T* dx_in, int64_t b, int64_t seq,
                                 Workspace<T>& ws, const T* cos, const T* sin) {
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

  // MLP: x_out = x_mid + down(h); h = silu(g) * u; g = gate(xn2); u = up(xn2)
  linear_backward<T>(a.h.data(), down_proj.w.data(), dx_out, ws.dh.data(), false, down_proj.g.data(), n, Fl_,
                     D_);
  swiglu_backward<T>(a.g.data(), a.u.data(), ws.dh.data(), ws.dg.data(), ws.du.data(), n * Fl_);
  linear_backward<T>(a.xn2.data(), gate_proj.w.data(), ws.dg.data(), ws.dxn.data(), false, gate_proj.g.data(),
                     n, D_, Fl_);
  linear_backward<T>(a.xn2.data(), up_proj.w.data(), ws.du.data(), ws.dxn.data(), true, up_proj.g.data(), n,
                     D_, Fl_);
  CKPT_RETURN_IF_ERROR(tp_sum(ws.dxn.data(), n * D_));  // column-parallel input gradient
  // dx_mid (kept in dx_in) = dx_out + rmsnorm backward
  std::copy(dx_out, dx_out + n * D_, dx_in);
  rmsnorm_backward<T>(a.x_mid.data(), post_attention_layernorm.w.data(), a.rstd2.data(), ws.dxn.data(), dx_in,
                      post_attention_layernorm.g.data(), n, D_);
  // Attention: x_mid = x_in + o(att)
  linear_backward<T>(a.att.data(), o_proj.w.data(), dx_in, ws.datt.data(), false, o_proj.g.data(), n, Q, D_);
  attention_backward<T>(a.q.data(), a.k.data(), a.v.data(), a.probs.data(), ws.datt.data(), ws.dq.data(),
                        ws.dk.data(), ws.dv.data(), ws.dscores.data(), b, seq, Hl_, Kl_, hd_);
  rope_apply<T>(ws.dq.data(), n, seq, Hl_, hd_, cos, sin, true);
  rope_apply<T>(ws.dk.data(), n, seq, Kl_, hd_, cos, sin, true);
  linear_backward<T>(a.xn1.data(), q_proj.w.data(), ws.dq.data(), ws.dxn.data(), false, q_proj.g.data(), n, D_,
                     Q);
  linear_backward<T>(a.xn1.data(), k_proj.w.data(), ws.dk.data(), ws.dxn.data(), true, k_proj.g.data(), n, D_,
                     KV);
  linear_backward<T>(a.xn1.data(), v_proj.w.data(), ws.dv.data(), ws.dxn.data(), true, v_proj.g.data(), n, D_,
                     KV);
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
