// One LLaMA decoder layer of the reference trainer, forward and backward by hand on top of
// trainer/model/ops.h; the families' variants: q/k/v biases (Qwen2-MoE), per-head q/k RMSNorm
// before RoPE (Qwen3-MoE), a mixture-of-experts MLP (trainer/model/moe_mlp.h) where the config
// says the layer is MoE (tp = 1 only). Optionally tensor-parallel (Megatron-LM): q/k/v (and their
// biases) and gate/up column-parallel (whole heads, whole KV groups and an even slice of the MLP
// per TP rank), o_proj and down_proj row-parallel with the all-reduce of their output in forward;
// in backward the all-reduce of the gradient of each normed input (the column-parallel block's
// input) before the RMSNorm backward. Norm weights are replicated; the q/k norms' gradients, which
// each rank sums over its own heads only, are all-reduced over TP per micro-batch. The activations
// of every micro-batch in flight are kept per slot (LayerActs); the backward scratch (Workspace)
// is shared.
// Thread safety: a layer is used by one thread at a time (BLAS may use several internally).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "converters/model/llama_config.h"
#include "formats/base/status.h"
#include "formats/tensor/region.h"
#include "reshard/dist/comm.h"
#include "trainer/model/moe_mlp.h"
#include "trainer/model/param.h"

namespace ckpt::trainer {

// Scratch shared by all layers of a model during backward (sized for the largest micro-batch).
template <class T>
struct Workspace {
  std::vector<T> dh, dg, du;    // [n, F/tp]
  std::vector<T> dxn;           // [n, D]
  std::vector<T> datt, dq;      // [n, H/tp*hd]
  std::vector<T> dk, dv;        // [n, K/tp*hd]
  std::vector<T> dkn;           // [n, K/tp*hd] (q/k norm backward)
  std::vector<T> dqk_norm;      // [2 hd] q/k norm weight gradients of one micro-batch (tp > 1)
  std::vector<T> dscores;       // [seq, seq]
  std::vector<T> dres0, dres1;  // [n, D] residual gradient ping-pong of a stage
};

// Saved activations of one micro-batch in one layer (n = b * seq; local = this TP rank's part).
template <class T>
struct LayerActs {
  std::vector<T> xn1;        // [n, D] input_layernorm output
  std::vector<T> rstd1;      // [n]
  std::vector<T> q, k, v;    // [n, Hl*hd], [n, Kl*hd], [n, Kl*hd] (q, k after RoPE)
  std::vector<T> q_raw, k_raw;    // [n, Hl*hd], [n, Kl*hd] q, k before their norms (qk_norm)
  std::vector<T> rstd_q, rstd_k;  // [n*Hl], [n*Kl]
  std::vector<T> probs;      // [b, Hl, seq, seq]
  std::vector<T> att;        // [n, Hl*hd] attention output before o_proj
  std::vector<T> x_mid;      // [n, D] residual after attention
  std::vector<T> xn2;        // [n, D] post_attention_layernorm output
  std::vector<T> rstd2;      // [n]
  std::vector<T> g, u, h;    // [n, Fl] gate, up, silu(gate)*up (dense MLP)
};

// The TP placement of a layer: rank `rank` of `size`, collectives over `comm` (null when size 1).
struct TpPart {
  int size = 1;
  int rank = 0;
  Comm* comm = nullptr;
};

template <class T>
class DecoderLayer {
 public:
  // Allocates this TP rank's part of layer `index` (the caller checked that tp divides the
  // heads, the KV heads and intermediate_size). specs: param_specs(c, index); boxes: the box held
  // of each parameter, in params() order.
  DecoderLayer(const LlamaConfig& c, int64_t index, TpPart tp, const std::vector<Box>& boxes,
               const std::vector<std::pair<std::string, Shape>>& specs);

  int64_t index() const { return index_; }
  // Parameters in canonical order (llama_layer_param_names).
  std::vector<Param<T>*> params();
  // Canonical names and global shapes of the parameters of layer `index`, params() order
  // (llama_model_tensors); layer_specs: those of every layer at once.
  static std::vector<std::pair<std::string, Shape>> param_specs(const LlamaConfig& c, int64_t index);
  static std::vector<std::vector<std::pair<std::string, Shape>>> layer_specs(const LlamaConfig& c);
  bool is_moe() const { return moe.active(); }

  void set_slots(int k);
  // x_out[n, D] = layer(x_in[n, D]) for n = b * seq rows (b sequences of seq tokens, positions
  // 0..seq-1); activations saved in `slot`. cos/sin: rope tables [seq, hd/2]. x_in must stay
  // unchanged until backward of the slot (it is not copied). An MoE layer adds its router
  // statistics to `totals` (may be null).
  Status forward(int slot, const T* x_in, T* x_out, int64_t b, int64_t seq, const T* cos, const T* sin,
                 RouterTotals* totals = nullptr);
  // dx_in[n, D] = d(loss)/d(x_in) given dx_out[n, D] and the x_in of the slot's forward;
  // parameter gradients are accumulated into Param::g. dx_in must not alias dx_out. aux_dp[E]:
  // the load-balancing loss's gradient per routing probability (MoE layers; may be null).
  Status backward(int slot, const T* x_in, const T* dx_out, T* dx_in, int64_t b, int64_t seq,
                  Workspace<T>& ws, const T* cos, const T* sin, const T* aux_dp = nullptr);

  Param<T> input_layernorm;           // [D]
  Param<T> q_proj;                    // [H*hd, D]    rows of this rank's heads
  Param<T> k_proj;                    // [K*hd, D]    rows of this rank's KV groups
  Param<T> v_proj;                    // [K*hd, D]
  Param<T> o_proj;                    // [D, H*hd]    columns of this rank's heads
  Param<T> post_attention_layernorm;  // [D]
  Param<T> gate_proj;                 // [F, D]       rows [r*F/tp, (r+1)*F/tp)
  Param<T> up_proj;                   // [F, D]
  Param<T> down_proj;                 // [D, F]       columns [r*F/tp, (r+1)*F/tp)
  Param<T> q_bias, k_bias, v_bias;    // [H*hd], [K*hd], [K*hd] (qkv_bias) rows of this rank's heads / KV groups
  Param<T> q_norm, k_norm;            // [hd] (qk_norm) replicated over TP
  MoeMlp<T> moe;                      // instead of gate/up/down_proj in an MoE layer

 private:
  Status tp_sum(T* buf, int64_t n);
  // q, k, v of the slot from xn1 (biases, q/k norms, RoPE).
  void qkv_forward(LayerActs<T>& a, int64_t n, int64_t seq, const T* cos, const T* sin);
  // dxn[n, D] = d(loss)/d(xn1) from ws.dq, ws.dk, ws.dv (after the attention backward).
  // With tp > 1 the q/k norm weight gradients are summed over TP here (each rank's heads add a part).
  Status qkv_backward(LayerActs<T>& a, int64_t n, int64_t seq, Workspace<T>& ws, const T* cos, const T* sin);

  int64_t index_;
  int64_t D_, Fl_, Hl_, Kl_, hd_;  // local sizes: F/tp, H/tp, K/tp
  double eps_;
  bool qkv_bias_ = false, qk_norm_ = false;
  TpPart tp_;
  std::vector<LayerActs<T>> acts_;  // per slot
};

}  // namespace ckpt::trainer
