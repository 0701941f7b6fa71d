// One LLaMA decoder layer of the reference trainer, forward and backward by hand on top of
// trainer/model/ops.h, optionally tensor-parallel (Megatron-LM): q/k/v and gate/up column-parallel
// (whole heads, whole KV groups and an even slice of the MLP per TP rank), o_proj and down_proj
// row-parallel with the all-reduce of their output in forward; in backward the all-reduce of the
// gradient of each normed input (the column-parallel block's input) before the RMSNorm backward.
// Norm weights are replicated. The activations of every micro-batch in flight are kept per slot
// (LayerActs); the backward scratch (Workspace) is shared.
// Thread safety: a layer is used by one thread at a time (BLAS may use several internally).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "converters/model/llama_config.h"
#include "formats/base/status.h"
#include "formats/tensor/region.h"
#include "reshard/dist/comm.h"

namespace ckpt::trainer {

// v gets n elements (zeroed when its size changes; kept as is otherwise).
template <class T>
inline void resize_buffer(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) != n) v.assign(static_cast<size_t>(n), T(0));
}

template <class T>
struct Param {
  std::string name;  // canonical HF name, e.g. "model.layers.3.mlp.up_proj.weight"
  Shape shape;       // global shape, HF orientation [out, in]
  Box box;           // the part held here (Box::whole(shape) unless sharded)
  bool decay = true; // AdamW weight decay applies (false for RMSNorm weights)
  bool tp_replicated = false;  // every TP rank holds the same values (norms when tp > 1): counted
                               // once (on TP rank 0) in the global gradient norm
  std::vector<T> w;  // values, dense row-major of box.extent
  std::vector<T> g;  // gradient accumulator, same layout as w

  void allocate(std::string n, Shape s, bool wd);
  // Holds only `b` (a validated box of `s`).
  void allocate(std::string n, Shape s, Box b, bool wd);
  int64_t numel() const { return static_cast<int64_t>(w.size()); }
};

// Scratch shared by all layers of a model during backward (sized for the largest micro-batch).
template <class T>
struct Workspace {
  std::vector<T> dh, dg, du;    // [n, F/tp]
  std::vector<T> dxn;           // [n, D]
  std::vector<T> datt, dq;      // [n, H/tp*hd]
  std::vector<T> dk, dv;        // [n, K/tp*hd]
  std::vector<T> dscores;       // [seq, seq]
  std::vector<T> dres0, dres1;  // [n, D] residual gradient ping-pong of a stage
};

// Saved activations of one micro-batch in one layer (n = b * seq; local = this TP rank's part).
template <class T>
struct LayerActs {
  std::vector<T> xn1;        // [n, D] input_layernorm output
  std::vector<T> rstd1;      // [n]
  std::vector<T> q, k, v;    // [n, Hl*hd], [n, Kl*hd], [n, Kl*hd] (q, k after RoPE)
  std::vector<T> probs;      // [b, Hl, seq, seq]
  std::vector<T> att;        // [n, Hl*hd] attention output before o_proj
  std::vector<T> x_mid;      // [n, D] residual after attention
  std::vector<T> xn2;        // [n, D] post_attention_layernorm output
  std::vector<T> rstd2;      // [n]
  std::vector<T> g, u, h;    // [n, Fl] gate, up, silu(gate)*up
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
  // heads, the KV heads and intermediate_size). boxes: the box held of each parameter, in
  // params() order.
  DecoderLayer(const LlamaConfig& c, int64_t index, TpPart tp, const std::vector<Box>& boxes);

  int64_t index() const { return index_; }
  // Parameters in canonical order (llama_layer_param_names).
  std::vector<Param<T>*> params();
  // Canonical names and global shapes of the parameters of layer `index`, params() order.
  static std::vector<std::pair<std::string, Shape>> param_specs(const LlamaConfig& c, int64_t index);

  void set_slots(int k) { acts_.resize(static_cast<size_t>(k)); }
  // x_out[n, D] = layer(x_in[n, D]) for n = b * seq rows (b sequences of seq tokens, positions
  // 0..seq-1); activations saved in `slot`. cos/sin: rope tables [seq, hd/2]. x_in must stay
  // unchanged until backward of the slot (it is not copied).
  Status forward(int slot, const T* x_in, T* x_out, int64_t b, int64_t seq, const T* cos, const T* sin);
  // dx_in[n, D] = d(loss)/d(x_in) given dx_out[n, D] and the x_in of the slot's forward;
  // parameter gradients are accumulated into Param::g. dx_in must not alias dx_out.
  Status backward(int slot, const T* x_in, const T* dx_out, T* dx_in, int64_t b, int64_t seq,
                  Workspace<T>& ws, const T* cos, const T* sin);

  Param<T> input_layernorm;           // [D]
  Param<T> q_proj;                    // [H*hd, D]    rows of this rank's heads
  Param<T> k_proj;                    // [K*hd, D]    rows of this rank's KV groups
  Param<T> v_proj;                    // [K*hd, D]
  Param<T> o_proj;                    // [D, H*hd]    columns of this rank's heads
  Param<T> post_attention_layernorm;  // [D]
  Param<T> gate_proj;                 // [F, D]       rows [r*F/tp, (r+1)*F/tp)
  Param<T> up_proj;                   // [F, D]
  Param<T> down_proj;                 // [D, F]       columns [r*F/tp, (r+1)*F/tp)

 private:
  Status tp_sum(T* buf, int64_t n);

  int64_t index_;
  int64_t D_, Fl_, Hl_, Kl_, hd_;  // local sizes: F/tp, H/tp, K/tp
  double eps_;
  TpPart tp_;
  std::vector<LayerActs<T>> acts_;  // per slot
};

}  // namespace ckpt::trainer
