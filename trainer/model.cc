#include "trainer/model.h"

#include <algorithm>
#include <cstring>

#include "formats/checked.h"
#include "trainer/init.h"
#include "trainer/ops.h"

namespace ckpt::trainer {

namespace {
// The reference trainer keeps everything in memory: refuse configs whose parameters (value +
// gradient + two Adam moments) or activations would not fit any machine it runs on.
constexpr int64_t kMaxParamElems = int64_t{4} << 30;       // 4 Gi elements per tensor set
constexpr int64_t kMaxActivationElems = int64_t{2} << 30;  // per buffer

template <class T>
void resize(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) != n) v.assign(static_cast<size_t>(n), T(0));
}
}  // namespace

template <class T>
void Param<T>::allocate(std::string n, Shape s, bool wd) {
  name = std::move(n);
  shape = std::move(s);
  box = Box::whole(shape);
  decay = wd;
  int64_t cnt = 1;
  for (int64_t d : shape) cnt *= d;  // validated by Model::create
  w.assign(static_cast<size_t>(cnt), T(0));
  g.assign(static_cast<size_t>(cnt), T(0));
}

template <class T>
DecoderLayer<T>::DecoderLayer(const LlamaConfig& c, int64_t index)
    : index_(index),
      D_(c.hidden_size),
      F_(c.intermediate_size),
      H_(c.num_attention_heads),
      K_(c.num_key_value_heads),
      hd_(c.head_dim),
      eps_(c.rms_norm_eps) {
  const std::string p = "model.layers." + std::to_string(index) + ".";
  input_layernorm.allocate(p + "input_layernorm.weight", {D_}, false);
  q_proj.allocate(p + "self_attn.q_proj.weight", {H_ * hd_, D_}, true);
  k_proj.allocate(p + "self_attn.k_proj.weight", {K_ * hd_, D_}, true);
  v_proj.allocate(p + "self_attn.v_proj.weight", {K_ * hd_, D_}, true);
  o_proj.allocate(p + "self_attn.o_proj.weight", {D_, H_ * hd_}, true);
  post_attention_layernorm.allocate(p + "post_attention_layernorm.weight", {D_}, false);
  gate_proj.allocate(p + "mlp.gate_proj.weight", {F_, D_}, true);
  up_proj.allocate(p + "mlp.up_proj.weight", {F_, D_}, true);
  down_proj.allocate(p + "mlp.down_proj.weight", {D_, F_}, true);
}

template <class T>
std::vector<Param<T>*> DecoderLayer<T>::params() {
  return {&input_layernorm, &q_proj, &k_proj, &v_proj, &o_proj,
          &post_attention_layernorm, &gate_proj, &up_proj, &down_proj};
}

template <class T>
void DecoderLayer<T>::forward(const T* x_in, T* x_out, int64_t b, int64_t seq, const T* cos,
                              const T* sin) {
  b_ = b;
  seq_ = seq;
  const int64_t n = b * seq, Q = H_ * hd_, KV = K_ * hd_;
  resize(x_in_, n * D_);
  resize(xn1_, n * D_);
  resize(rstd1_, n);
  resize(q_, n * Q);
  resize(k_, n * KV);
  resize(v_, n * KV);
  resize(probs_, b * H_ * seq * seq);
  resize(att_, n * Q);
  resize(x_mid_, n * D_);
  resize(xn2_, n * D_);
  resize(rstd2_, n);
  resize(g_, n * F_);
  resize(u_, n * F_);
  resize(h_, n * F_);

  std::copy(x_in, x_in + n * D_, x_in_.begin());
  rmsnorm_forward<T>(x_in, input_layernorm.w.data(), xn1_.data(), rstd1_.data(), n, D_, eps_);
  linear_forward<T>(xn1_.data(), q_proj.w.data(), q_.data(), n, D_, Q);
  linear_forward<T>(xn1_.data(), k_proj.w.data(), k_.data(), n, D_, KV);
  linear_forward<T>(xn1_.data(), v_proj.w.data(), v_.data(), n, D_, KV);
  rope_apply<T>(q_.data(), n, seq, H_, hd_, cos, sin, false);
  rope_apply<T>(k_.data(), n, seq, K_, hd_, cos, sin, false);
  attention_forward<T>(q_.data(), k_.data(), v_.data(), probs_.data(), att_.data(), b, seq, H_, K_,
                       hd_);
  // x_mid = x_in + o_proj(att)
  linear_forward<T>(att_.data(), o_proj.w.data(), x_mid_.data(), n, Q, D_);
  for (int64_t i = 0; i < n * D_; ++i) x_mid_[i] += x_in[i];
  rmsnorm_forward<T>(x_mid_.data(), post_attention_layernorm.w.data(), xn2_.data(), rstd2_.data(),
                     n, D_, eps_);
  linear_forward<T>(xn2_.data(), gate_proj.w.data(), g_.data(), n, D_, F_);
  linear_forward<T>(xn2_.data(), up_proj.w.data(), u_.data(), n, D_, F_);
  swiglu_forward<T>(g_.data(), u_.data(), h_.data(), n * F_);
  // x_out = x_mid + down_proj(h)
  linear_forward<T>(h_.data(), down_proj.w.data(), x_out, n, F_, D_);
  for (int64_t i = 0; i < n * D_; ++i) x_out[i] += x_mid_[i];
}

template <class T>
void DecoderLayer<T>::backward(const T* dx_out, T* dx_in, Workspace<T>& ws, const T* cos,
                               const T* sin) {
  const int64_t n = b_ * seq_, Q = H_ * hd_, KV = K_ * hd_;
  resize(ws.dh, n * F_);
  resize(ws.dg, n * F_);
  resize(ws.du, n * F_);
  resize(ws.dxn, n * D_);
  resize(ws.datt, n * Q);
  resize(ws.dq, n * Q);
  resize(ws.dk, n * KV);
  resize(ws.dv, n * KV);
  resize(ws.dscores, seq_ * seq_);

  // MLP: x_out = x_mid + down(h); h = silu(g) * u; g = gate(xn2); u = up(xn2)
  linear_backward<T>(h_.data(), down_proj.w.data(), dx_out, ws.dh.data(), false,
                     down_proj.g.data(), n, F_, D_);
  swiglu_backward<T>(g_.data(), u_.data(), ws.dh.data(), ws.dg.data(), ws.du.data(), n * F_);
  linear_backward<T>(xn2_.data(), gate_proj.w.data(), ws.dg.data(), ws.dxn.data(), false,
                     gate_proj.g.data(), n, D_, F_);
  linear_backward<T>(xn2_.data(), up_proj.w.data(), ws.du.data(), ws.dxn.data(), true,
                     up_proj.g.data(), n, D_, F_);
  // dx_mid (kept in dx_in) = dx_out + rmsnorm backward
  std::copy(dx_out, dx_out + n * D_, dx_in);
  rmsnorm_backward<T>(x_mid_.data(), post_attention_layernorm.w.data(), rstd2_.data(),
                      ws.dxn.data(), dx_in, post_attention_layernorm.g.data(), n, D_);
  // Attention: x_mid = x_in + o(att)
  linear_backward<T>(att_.data(), o_proj.w.data(), dx_in, ws.datt.data(), false, o_proj.g.data(),
                     n, Q, D_);
  attention_backward<T>(q_.data(), k_.data(), v_.data(), probs_.data(), ws.datt.data(),
                        ws.dq.data(), ws.dk.data(), ws.dv.data(), ws.dscores.data(), b_, seq_, H_,
                        K_, hd_);
  rope_apply<T>(ws.dq.data(), n, seq_, H_, hd_, cos, sin, true);
  rope_apply<T>(ws.dk.data(), n, seq_, K_, hd_, cos, sin, true);
  linear_backward<T>(xn1_.data(), q_proj.w.data(), ws.dq.data(), ws.dxn.data(), false,
                     q_proj.g.data(), n, D_, Q);
  linear_backward<T>(xn1_.data(), k_proj.w.data(), ws.dk.data(), ws.dxn.data(), true,
                     k_proj.g.data(), n, D_, KV);
  linear_backward<T>(xn1_.data(), v_proj.w.data(), ws.dv.data(), ws.dxn.data(), true,
                     v_proj.g.data(), n, D_, KV);
  // dx_in = dx_mid + rmsnorm backward (accumulates into dx_in)
  rmsnorm_backward<T>(x_in_.data(), input_layernorm.w.data(), rstd1_.data(), ws.dxn.data(), dx_in,
                      input_layernorm.g.data(), n, D_);
}

template <class T>
Result<Model<T>> Model<T>::create(const LlamaConfig& c, StageRange stage) {
  if (c.attention_bias || c.mlp_bias)
    return Status::Unsupported("the reference trainer has no bias support (attention_bias / mlp_bias must be false)");
  if (c.hidden_act != "silu")
    return Status::Unsupported("hidden_act '" + c.hidden_act + "': the reference trainer implements silu only");
  if (c.vocab_size <= 0 || c.hidden_size <= 0 || c.intermediate_size <= 0 || c.num_hidden_layers <= 0 ||
      c.num_attention_heads <= 0 || c.num_key_value_heads <= 0 || c.head_dim <= 0)
    return Status::InvalidArgument("model config: every size must be positive");
  if (c.head_dim % 2 != 0)
    return Status::InvalidArgument("model config: head_dim must be even for RoPE, got " + std::to_string(c.head_dim));
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    return Status::InvalidArgument("model config: num_attention_heads (" + std::to_string(c.num_attention_heads) +
                                   ") must be a multiple of num_key_value_heads (" +
                                   std::to_string(c.num_key_value_heads) + ")");
  if (!(c.rms_norm_eps > 0) || !(c.rope_theta > 0))
    return Status::InvalidArgument("model config: rms_norm_eps and rope_theta must be positive");
  // Every parameter tensor size, checked.
  int64_t total = 0;
  for (const auto& t : llama_model_tensors(c, DType::kF32)) {
    auto n = checked_numel(t.shape);
    auto s = n ? checked_add(total, *n) : std::nullopt;
    if (!s || *s > kMaxParamElems)
      return Status::InvalidArgument("model config: parameters exceed the reference trainer's limit of " +
                                     std::to_string(kMaxParamElems) + " elements (tensor '" + t.name + "')");
    total = *s;
  }
  if (auto m = checked_mul(c.num_attention_heads, c.head_dim); !m || *m > (int64_t{1} << 24))
    return Status::InvalidArgument("model config: num_attention_heads * head_dim too large");
  const int64_t L = c.num_hidden_layers;
  int64_t end = stage.layer_end < 0 ? L : stage.layer_end;
  if (stage.layer_begin < 0 || stage.layer_begin >= end || end > L)
    return Status::InvalidArgument("stage layers [" + std::to_string(stage.layer_begin) + ", " +
                                   std::to_string(end) + ") not inside [0, " + std::to_string(L) + ")");
  Model m;
  m.cfg_ = c;
  m.layer_begin_ = stage.layer_begin;
  m.layer_end_ = end;
  if (m.has_embedding() || (m.has_head() && c.tie_word_embeddings))
    m.embed_.allocate("model.embed_tokens.weight", {c.vocab_size, c.hidden_size}, true);
  m.layers_.reserve(static_cast<size_t>(end - stage.layer_begin));
  for (int64_t i = stage.layer_begin; i < end; ++i) m.layers_.emplace_back(c, i);
  if (m.has_head()) {
    m.norm_.allocate("model.norm.weight", {c.hidden_size}, false);
    if (!c.tie_word_embeddings) m.lm_head_.allocate("lm_head.weight", {c.vocab_size, c.hidden_size}, true);
  }
  return m;
}

template <class T>
std::vector<Param<T>*> Model<T>::params() {
  std::vector<Param<T>*> out;
  if (!embed_.w.empty()) out.push_back(&embed_);
  for (auto& l : layers_)
    for (auto* p : l.params()) out.push_back(p);
  if (has_head()) {
    out.push_back(&norm_);
    if (!cfg_.tie_word_embeddings) out.push_back(&lm_head_);
  }
  return out;
}

template <class T>
Param<T>* Model<T>::find(const std::string& name) {
  for (auto* p : params())
    if (p->name == name) return p;
  return nullptr;
}

template <class T>
Status Model<T>::init(uint64_t seed) {
  for (auto* p : params())
    CKPT_RETURN_IF_ERROR(init_box<T>(seed, p->name, p->shape, p->box, p->w.data()));
  return Status::Ok();
}

template <class T>
void Model<T>::zero_grad() {
  for (auto* p : params()) std::fill(p->g.begin(), p->g.end(), T(0));
}

template <class T>
int64_t Model<T>::num_params() const {
  int64_t n = 0;
  for (auto* p : const_cast<Model*>(this)->params()) n += p->numel();
  return n;
}

template <class T>
double Model<T>::train_flops_per_token(int64_t seq) const {
  const LlamaConfig& c = cfg_;
  const double D = static_cast<double>(c.hidden_size), F = static_cast<double>(c.intermediate_size);
  const double Q = static_cast<double>(c.num_attention_heads * c.head_dim);
  const double KV = static_cast<double>(c.num_key_value_heads * c.head_dim);
  const double L = static_cast<double>(layer_end_ - layer_begin_);
  double linear = L * (D * Q + 2 * D * KV + Q * D + 3 * D * F);
  if (has_head()) linear += static_cast<double>(c.vocab_size) * D;
  return 6.0 * linear + 12.0 * L * static_cast<double>(seq) * Q;
}

template <class T>
Status Model<T>::check_batch(const int32_t* tokens, const int32_t* targets, int64_t b,
                             int64_t seq) const {
  if (b <= 0 || seq <= 0) return Status::InvalidArgument("batch and sequence length must be positive");
  if (seq > cfg_.max_position_embeddings)
    return Status::InvalidArgument("sequence length " + std::to_string(seq) +
                                   " exceeds max_position_embeddings " +
                                   std::to_string(cfg_.max_position_embeddings));
  auto n = checked_mul(b, seq);
  const int64_t widest = std::max({cfg_.hidden_size, cfg_.intermediate_size, cfg_.vocab_size,
                                   cfg_.num_attention_heads * cfg_.head_dim});
  auto a1 = n ? checked_mul(*n, widest) : std::nullopt;
  auto a2 = n ? checked_mul(*n, cfg_.num_attention_heads * seq) : std::nullopt;
  if (!a1 || !a2 || *a1 > kMaxActivationElems || *a2 > kMaxActivationElems)
    return Status::InvalidArgument("micro-batch " + std::to_string(b) + " x " + std::to_string(seq) +
                                   " needs activation buffers beyond the trainer's limit");
  for (int64_t i = 0; i < *n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= cfg_.vocab_size)
      return Status::InvalidArgument("token " + std::to_string(tokens[i]) + " at position " +
                                     std::to_string(i) + " outside the vocabulary [0, " +
                                     std::to_string(cfg_.vocab_size) + ")");
    if (targets && (targets[i] < 0 || targets[i] >= cfg_.vocab_size))
      return Status::InvalidArgument("target " + std::to_string(targets[i]) + " at position " +
                                     std::to_string(i) + " outside the vocabulary [0, " +
                                     std::to_string(cfg_.vocab_size) + ")");
  }
  if (!has_embedding() || !has_head())
    return Status::Unsupported("a partial pipeline stage needs the parallel trainer");
  return Status::Ok();
}

template <class T>
void Model<T>::run_forward(const int32_t* tokens, int64_t b, int64_t seq) {
  const int64_t n = b * seq, D = cfg_.hidden_size, V = cfg_.vocab_size;
  if (rope_seq_ != seq) {
    rope_tables<T>(seq, cfg_.head_dim, cfg_.rope_theta, cos_, sin_);
    rope_seq_ = seq;
  }
  resize(x0_, n * D);
  resize(x1_, n * D);
  resize(xf_, n * D);
  resize(rstdf_, n);
  resize(logits_, n * V);
  tok_copy_.assign(tokens, tokens + n);
  // x0[n, D] = embed[tokens]
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(&x0_[static_cast<size_t>(i * D)], &embed_.w[static_cast<size_t>(tokens[i]) * D], sizeof(T) * D);
  T* cur = x0_.data();
  T* nxt = x1_.data();
  for (auto& l : layers_) {
    l.forward(cur, nxt, b, seq, cos_.data(), sin_.data());
    std::swap(cur, nxt);
  }
  rmsnorm_forward<T>(cur, norm_.w.data(), xf_.data(), rstdf_.data(), n, D, cfg_.rms_norm_eps);
  const T* head = cfg_.tie_word_embeddings ? embed_.w.data() : lm_head_.w.data();
  linear_forward<T>(xf_.data(), head, logits_.data(), n, D, V);
}

template <class T>
Result<double> Model<T>::forward(const int32_t* tokens, const int32_t* targets, int64_t b,
                                 int64_t seq, std::vector<T>* logits) {
  CKPT_RETURN_IF_ERROR(check_batch(tokens, targets, b, seq));
  run_forward(tokens, b, seq);
  if (logits) *logits = logits_;
  if (!targets) return 0.0;
  return cross_entropy<T>(logits_.data(), targets, nullptr, b * seq, cfg_.vocab_size, T(1));
}

template <class T>
Result<double> Model<T>::forward_backward(const int32_t* tokens, const int32_t* targets, int64_t b,
                                          int64_t seq, T loss_scale) {
  CKPT_RETURN_IF_ERROR(check_batch(tokens, targets, b, seq));
  if (!targets) return Status::InvalidArgument("forward_backward needs targets");
  run_forward(tokens, b, seq);
  const int64_t n = b * seq, D = cfg_.hidden_size, V = cfg_.vocab_size;
  // dlogits [n, V] in place
  const double loss = cross_entropy<T>(logits_.data(), targets, logits_.data(), n, V, loss_scale);
  const T* head = cfg_.tie_word_embeddings ? embed_.w.data() : lm_head_.w.data();
  T* dhead = cfg_.tie_word_embeddings ? embed_.g.data() : lm_head_.g.data();
  // The final residual stream is in x0_ when the layer count is even, else x1_.
  T* cur = (layers_.size() % 2 == 0) ? x0_.data() : x1_.data();
  T* other = (cur == x0_.data()) ? x1_.data() : x0_.data();
  resize(ws_.dxn, n * D);
  linear_backward<T>(xf_.data(), head, logits_.data(), ws_.dxn.data(), false, dhead, n, D, V);
  std::fill(other, other + n * D, T(0));
  rmsnorm_backward<T>(cur, norm_.w.data(), rstdf_.data(), ws_.dxn.data(), other, norm_.g.data(), n, D);
  // other = d(loss)/d(x_L); walk the layers backwards.
  for (auto it = layers_.rbegin(); it != layers_.rend(); ++it) {
    it->backward(other, cur, ws_, cos_.data(), sin_.data());
    std::swap(cur, other);
  }
  // other = d(loss)/d(x0): scatter into the embedding rows.
  for (int64_t i = 0; i < n; ++i) {
    T* row = &embed_.g[static_cast<size_t>(tok_copy_[static_cast<size_t>(i)]) * D];
    const T* src = other + i * D;
    for (int64_t j = 0; j < D; ++j) row[j] += src[j];
  }
  return loss;
}

template struct Param<float>;
template struct Param<double>;
template class DecoderLayer<float>;
template class DecoderLayer<double>;
template class Model<float>;
template class Model<double>;

}  // namespace ckpt::trainer
