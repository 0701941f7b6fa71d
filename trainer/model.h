// The reference decoder-only LLaMA model (HF LlamaForCausalLM semantics), fp32 (or fp64 for
// gradient checks), forward and backward by hand on top of trainer/ops.h.
// Structure for parallel layouts: a Model owns a contiguous range of decoder layers (a pipeline
// stage), plus the embedding (first stage) and final norm + head (last stage). Every parameter is
// a Param: a canonical HF name, its global shape and the Box of it this process holds (the whole
// tensor today; a TP shard later), with value and gradient buffers of the box's extent.
// Thread safety: a Model is used by one thread at a time (BLAS may use several internally).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "converters/llama_config.h"
#include "formats/region.h"
#include "formats/status.h"
#include "reshard/comm.h"
#include "reshard/layout.h"

namespace ckpt::trainer {

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
  int64_t numel() const { return static_cast<int64_t>(w.size()); }
};

// Scratch shared by all layers of a model during backward (sized for the largest micro-batch).
template <class T>
struct Workspace {
  std::vector<T> dh, dg, du;    // [n, F]
  std::vector<T> dxn;           // [n, D]
  std::vector<T> datt, dq;      // [n, H*hd]
  std::vector<T> dk, dv;        // [n, K*hd]
  std::vector<T> dscores;       // [seq, seq]
};

template <class T>
class DecoderLayer {
 public:
  DecoderLayer(const LlamaConfig& c, int64_t index);

  int64_t index() const { return index_; }
  // Parameters in canonical order (llama_layer_param_names).
  std::vector<Param<T>*> params();

  // x_out[n, D] = layer(x_in[n, D]) for n = b * seq rows (b sequences of seq tokens, positions
  // 0..seq-1). Saves the activations needed by backward. cos/sin: rope tables [seq, hd/2].
  void forward(const T* x_in, T* x_out, int64_t b, int64_t seq, const T* cos, const T* sin);
  // dx_in[n, D] = d(loss)/d(x_in) given dx_out[n, D] (from the last forward); parameter
  // gradients are accumulated into Param::g. dx_in must not alias dx_out.
  void backward(const T* dx_out, T* dx_in, Workspace<T>& ws, const T* cos, const T* sin);

  Param<T> input_layernorm;           // [D]
  Param<T> q_proj;                    // [H*hd, D]
  Param<T> k_proj;                    // [K*hd, D]
  Param<T> v_proj;                    // [K*hd, D]
  Param<T> o_proj;                    // [D, H*hd]
  Param<T> post_attention_layernorm;  // [D]
  Param<T> gate_proj;                 // [F, D]
  Param<T> up_proj;                   // [F, D]
  Param<T> down_proj;                 // [D, F]

 private:
  int64_t index_;
  int64_t D_, F_, H_, K_, hd_;
  double eps_;
  int64_t b_ = 0, seq_ = 0;
  // Activations of the last forward (n = b * seq):
  std::vector<T> x_in_;    // [n, D]
  std::vector<T> xn1_;     // [n, D] input_layernorm output
  std::vector<T> rstd1_;   // [n]
  std::vector<T> q_, k_, v_;  // [n, H*hd], [n, K*hd], [n, K*hd] (q, k after RoPE)
  std::vector<T> probs_;   // [b, H, seq, seq]
  std::vector<T> att_;     // [n, H*hd] attention output before o_proj
  std::vector<T> x_mid_;   // [n, D] residual after attention
  std::vector<T> xn2_;     // [n, D] post_attention_layernorm output
  std::vector<T> rstd2_;   // [n]
  std::vector<T> g_, u_, h_;  // [n, F] gate, up, silu(gate)*up
};

// Which part of the model a process holds (a pipeline stage: layers [layer_begin, layer_end)).
struct StageRange {
  int64_t layer_begin = 0;
  int64_t layer_end = -1;  // -1: through the last layer
};

// The part of the model one rank holds under a Layout: pipeline stage `pp_rank`, tensor-parallel
// rank `tp_rank` (boxes from LlamaShardingRules::place, one definition with the store), and the
// TP group for the forward/backward all-reduces (null when layout.tp == 1).
struct ModelShard {
  Layout layout;      // tp, pp, stage_of_layer, vocab_divisor are used
  int pp_rank = 0;
  int tp_rank = 0;
  Comm* tp = nullptr;  // size layout.tp, rank tp_rank
};

template <class T>
class Model {
 public:
  // Validates the config for this trainer (no biases, even head_dim, sizes that fit memory and
  // int64 arithmetic) and allocates zeroed parameters.
  static Result<Model> create(const LlamaConfig& c, StageRange stage = {});
  // A shard under a layout. Refuses (LayoutRefused, naming the numbers) tp not dividing the
  // attention heads, the KV heads or intermediate_size. Allocates only this rank's boxes.
  static Result<Model> create(const LlamaConfig& c, const ModelShard& shard);

  // Pipeline-stage interface: 1F1B keeps several micro-batches in flight; `slot` in [0, slots)
  // names the saved activations of one of them. set_slots(k) before the first stage_forward.
  void set_slots(int k);
  // Forward of one micro-batch (b sequences of seq tokens) through this stage.
  // First stage: `tokens` [b*seq] (x_in ignored); other stages: x_in [b*seq, D] from the previous
  // stage. Not the last stage: x_out [b*seq, D] receives the output, returns 0.
  // Last stage: `targets` [b*seq]; returns the SUM of the token losses (vocab-parallel
  // cross-entropy, identical on every TP rank) and keeps loss_scale * d(sum)/d(logits) for
  // stage_backward (x_out unused). Tokens and targets are checked against the vocabulary.
  Result<double> stage_forward(int slot, const int32_t* tokens, const T* x_in, const int32_t* targets,
                               int64_t b, int64_t seq, T loss_scale, T* x_out);
  // Backward of the micro-batch in `slot`. dx_out [b*seq, D] = d(loss)/d(x_out) from the next
  // stage (ignored on the last stage). dx_in [b*seq, D] receives d(loss)/d(x_in) (ignored on the
  // first stage, which accumulates the embedding gradient instead). Parameter gradients
  // accumulate (+=) into Param::g. The slot may be reused afterwards.
  Status stage_backward(int slot, const T* dx_out, T* dx_in);
  int64_t layer_begin() const { return layer_begin_; }
  int64_t layer_end() const { return layer_end_; }

  const LlamaConfig& config() const { return cfg_; }
  bool has_embedding() const { return layer_begin_ == 0; }
  bool has_head() const { return layer_end_ == cfg_.num_hidden_layers; }

  // Every parameter held, in canonical order (llama_model_tensors). With tied embeddings the
  // head is model.embed_tokens.weight (listed once).
  std::vector<Param<T>*> params();
  Param<T>* find(const std::string& name);
  // init_box of every parameter from `seed` (layout independent).
  Status init(uint64_t seed);
  void zero_grad();
  int64_t num_params() const;

  // Forward (and backward) of one micro-batch: tokens, targets [b, seq]. Returns the SUM of the
  // token losses. Gradients are accumulated (+=) as loss_scale * d(sum)/d(param); the trainer
  // passes loss_scale = 1 / (tokens of the whole step) so that the step's loss is the mean.
  // Errors: tokens or targets outside [0, vocab), sizes too large.
  Result<double> forward_backward(const int32_t* tokens, const int32_t* targets, int64_t b,
                                  int64_t seq, T loss_scale);
  // Forward only. logits (if non-null) receives [b*seq, V]. Returns the sum of token losses when
  // targets is non-null, else 0.
  Result<double> forward(const int32_t* tokens, const int32_t* targets, int64_t b, int64_t seq,
                         std::vector<T>* logits);

  // Model FLOPs of one training token (forward + backward = 3 x forward matmul FLOPs):
  // 6 * (linear weights incl. head) + 12 * layers * seq * H * hd (scores and P*V, full square).
  double train_flops_per_token(int64_t seq) const;

 private:
  Model() = default;
  Status check_batch(const int32_t* tokens, const int32_t* targets, int64_t b, int64_t seq) const;
  void run_forward(const int32_t* tokens, int64_t b, int64_t seq);

  LlamaConfig cfg_;
  int64_t layer_begin_ = 0, layer_end_ = 0;
  Param<T> embed_;                  // [V, D]
  std::vector<DecoderLayer<T>> layers_;
  Param<T> norm_;                   // [D]
  Param<T> lm_head_;                // [V, D] (unused when tied)
  Workspace<T> ws_;
  std::vector<T> cos_, sin_;        // [seq, hd/2]
  int64_t rope_seq_ = -1;
  std::vector<T> x0_, x1_;          // [n, D] residual stream ping-pong
  std::vector<T> xf_;               // [n, D] final norm output
  std::vector<T> rstdf_;            // [n]
  std::vector<T> logits_;           // [n, V] (dlogits in place during backward)
  const int32_t* tokens_ = nullptr; // of the last forward (for the embedding backward)
  std::vector<int32_t> tok_copy_;   // [n]
};

}  // namespace ckpt::trainer
