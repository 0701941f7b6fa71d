// The mixture-of-experts MLP of one decoder layer (docs/MOE.md), forward and backward by hand on
// the store's canonical stacked tensors, as transformers 5 computes it:
//   logits = x W_r^T                       router, mlp.gate.weight [E, D]
//   p = softmax(logits) over all E experts; the top-k of p (ties: lower expert first)
//   weights = p of the top-k, divided by their sum when renormalized (Mixtral always, which is
//             the softmax over the top-k logits; Qwen2/3-MoE when norm_topk_prob)
//   y = sum over the k picks of weight * down_e(silu(gate_e x) * up_e x)   dropless: every pick runs
//   (+ sigmoid(x w_s^T) * shared(x) with a shared expert; the sigmoid only for Qwen2-MoE)
// and the statistics of the load-balancing loss (transformers' load_balancing_loss_func): tokens
// per expert among the top-k picks and the sum of p per expert, accumulated over the layers.
// Float32 for training, float64 for the gradient checks. Expert parallelism (ep_forward /
// ep_backward, trainer/model/moe_mlp_ep.cc): the rank's experts and F slice only, the routed rows
// moved over the groups of trainer/model/moe_dispatch.h.
// Thread safety: used by one thread at a time (BLAS may use several internally).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "converters/model/llama_config.h"
#include "formats/base/status.h"
#include "formats/tensor/region.h"
#include "trainer/model/moe_dispatch.h"
#include "trainer/model/param.h"

namespace ckpt::trainer {

// The router statistics of one micro-batch over the MoE layers seen so far (load-balancing loss).
struct RouterTotals {
  std::vector<double> count;  // [E] top-k picks per expert, summed over layers
  std::vector<double> psum;   // [E] sum over tokens of softmax(logits)[e], summed over layers
  int64_t rows = 0;           // tokens x MoE layers
  void reset(int64_t experts) {
    count.assign(static_cast<size_t>(experts), 0.0);
    psum.assign(static_cast<size_t>(experts), 0.0);
    rows = 0;
  }
  // transformers' aux loss: E * sum_e (count_e / rows) * (psum_e / rows); 0 without rows.
  double aux_loss() const;
};

// The load-balancing loss's coefficient: config router_aux_loss_coef (kept in LlamaConfig::extra;
// transformers' default 0.001 when absent). InvalidConfig unless a finite number >= 0.
Result<double> router_aux_loss_coef(const LlamaConfig& c);

// Saved activations of one micro-batch (n tokens; R = n * k routed rows grouped by expert).
template <class T>
struct MoeActs {
  std::vector<T> probs;           // [n, E] softmax of the router logits
  std::vector<int32_t> pick;      // [n, k] selected experts
  std::vector<T> weight;          // [n, k] routing weights
  std::vector<int64_t> first;     // [E + 1] first grouped row of each expert
  std::vector<int32_t> row_token; // [R] token of each grouped row
  std::vector<int32_t> row_pick;  // [R] which of the token's k picks it is
  std::vector<T> xg;              // [R, D] gathered inputs
  std::vector<T> g, u, h;         // [R, F] gate, up, silu(gate) * up
  std::vector<T> y;               // [R, D] expert outputs before the routing weight
  std::vector<T> sg, su, sh;      // [n, Fs] the shared expert's gate, up, silu(gate) * up
  std::vector<T> sy;              // [n, D] the shared expert's output before its gate
  std::vector<T> sgate;           // [n] sigmoid of the shared expert gate (1 without one)
  // Expert parallelism (n here: the own tokens; xg/g/u/h: the Rg rows this rank computes, in
  // local-expert-major order; y: [R, D] the combined expert outputs of the own rows).
  int64_t lo = 0, own = 0;         // own tokens [lo, lo + own) of the layer input
  std::vector<int64_t> ep_recv;    // [ep * El] rows from each ep peer for each local expert
  std::vector<int64_t> ep_all;     // [etp * ep * El] ep_recv of every etp peer
  std::vector<int64_t> perm;       // [Rg] position in the etp-gathered rows of each computed row
  std::vector<int64_t> efirst;     // [El + 1] first computed row of each local expert
};

template <class T>
class MoeMlp {
 public:
  MoeMlp() = default;
  // Allocates the MoE MLP of layer `index` (whole tensors). specs: the layer's MLP parameters
  // after post_attention_layernorm, in canonical order (llama_layer_param_names).
  MoeMlp(const LlamaConfig& c, const std::vector<std::pair<std::string, Shape>>& specs);
  // Expert parallel: boxes[i] is the box held of specs[i] (the store's placement), `ep` the rank's
  // groups (not owned; must outlive the layer).
  MoeMlp(const LlamaConfig& c, const std::vector<std::pair<std::string, Shape>>& specs, const std::vector<Box>& boxes,
         ExpertGroups* ep);
  bool expert_parallel() const { return ep_ != nullptr; }

  bool active() const { return E_ > 0; }
  // max / mean of the tokens routed to each expert since the last call (1: balanced; 0 when
  // nothing was routed), then restarts the count.
  double take_load();
  // The tokens routed to each expert since the last call ([E]), then restarts the count.
  std::vector<double> take_counts();
  int64_t experts() const { return E_; }
  std::vector<Param<T>*> params();
  void set_slots(int k) { acts_.resize(static_cast<size_t>(k)); }

  // y[n, D] = moe(x[n, D]) (overwritten); the slot keeps what backward needs; totals += this
  // layer's router statistics.
  void forward(int slot, const T* x, T* y, int64_t n, RouterTotals* totals);
  // dx[n, D] = d(loss)/dx (overwritten) given dy[n, D] = d(loss)/dy and the x of the slot's
  // forward; parameter gradients accumulate. aux_dp[E] (may be null): d(loss)/d(p[t, e]) of the
  // load-balancing loss, the same for every token t.
  void backward(int slot, const T* x, const T* dy, T* dx, int64_t n, const T* aux_dp);
  // Expert parallel forms of forward / backward (x, y, dy, dx replicated over the TP group): the
  // own block of tokens is routed here, its rows computed by the ranks holding their experts.
  // totals: the own tokens' statistics (Model sums them over TP). The groups' errors as Status.
  Status ep_forward(int slot, const T* x, T* y, int64_t n, RouterTotals* totals);
  Status ep_backward(int slot, const T* x, const T* dy, T* dx, int64_t n, const T* aux_dp);

  Param<T> router;       // [E, D]     mlp.gate.weight
  Param<T> gate_proj;    // [E, F, D]  mlp.experts.gate_proj.weight
  Param<T> up_proj;      // [E, F, D]  mlp.experts.up_proj.weight
  Param<T> down_proj;    // [E, D, F]  mlp.experts.down_proj.weight
  Param<T> sh_gate;      // [Fs, D]    mlp.shared_experts.gate_proj.weight (Fs > 0)
  Param<T> sh_up;        // [Fs, D]    mlp.shared_experts.up_proj.weight
  Param<T> sh_down;      // [D, Fs]    mlp.shared_experts.down_proj.weight
  Param<T> sh_gate_w;    // [1, D]     mlp.shared_expert_gate.weight (Qwen2-MoE)

 private:
  void route(MoeActs<T>& a, const T* x, int64_t n);
  void experts_swiglu_forward(MoeActs<T>& a, const std::vector<int64_t>& first, int64_t experts, T* yrows);
  void shared_forward(MoeActs<T>& a, const T* x, T* y, int64_t n);
  void shared_backward(MoeActs<T>& a, const T* x, const T* dy, T* dx, int64_t n);
  // Their parts, shared with the expert-parallel path at tp > 1 (over this rank's Fsl columns).
  void shared_mlp_forward(MoeActs<T>& a, const T* x, int64_t n);
  void shared_gate_forward(MoeActs<T>& a, const T* x, T* y, int64_t n);
  void shared_gate_backward(const MoeActs<T>& a, const T* x, const T* dy, T* dx, int64_t n, std::vector<T>* dz);
  void shared_mlp_backward(const MoeActs<T>& a, const T* x, T* dxs, int64_t n);
  // dlogits[n, E] of the routing weights (dw[n, k]) and of the aux loss.
  void router_grad(const MoeActs<T>& a, const T* dw, const T* aux_dp, T* dlogits, int64_t n) const;
  // Expert parallel: the rows of the own tokens to the experts' ranks and back (moe_mlp_ep.cc).
  Status ep_dispatch(MoeActs<T>& a, const T* rows, std::vector<T>* gathered);
  Status ep_combine(MoeActs<T>& a, const T* gathered, T* rows);
  void ep_experts_forward(MoeActs<T>& a, std::vector<T>* out);
  void ep_experts_backward(MoeActs<T>& a, const std::vector<T>& dout, std::vector<T>* dx);
  void count_load(const MoeActs<T>& a, int64_t n, RouterTotals* totals);
  // Expert parallel at tp > 1: the shared expert on every token with its F slice (moe_mlp_ep.cc).
  Status ep_shared_forward(MoeActs<T>& a, const T* x, T* y, int64_t n);
  Status ep_shared_backward(MoeActs<T>& a, const T* x, const T* dy, T* dx, int64_t n);

  int64_t D_ = 0, E_ = 0, K_ = 0, F_ = 0, Fs_ = 0;
  bool renorm_ = false, has_shared_gate_ = false;
  std::vector<MoeActs<T>> acts_ = std::vector<MoeActs<T>>(1);
  std::vector<T> dye_, dh_, dg_, du_, dxg_, dw_, dlog_;  // backward scratch
  std::vector<int64_t> load_;                           // [E] picks per expert since take_load
  ExpertGroups* ep_ = nullptr;                          // expert parallel: the rank's groups
  int64_t El_ = 0, Fl_ = 0, Fsl_ = 0;                   // local experts, expert width, shared width (Fs/tp)
  std::vector<T> ep_a_, ep_b_, ep_c_;                   // expert-parallel scratch
};

}  // namespace ckpt::trainer
