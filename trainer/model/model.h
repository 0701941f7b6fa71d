// The reference decoder-only LLaMA model (HF LlamaForCausalLM semantics), fp32 (or fp64 for
// gradient checks), forward and backward by hand on top of trainer/model/ops.h.
// Structure for parallel layouts: a Model owns a contiguous range of decoder layers (a pipeline
// stage), plus the embedding (first stage) and final norm + head (last stage; with tied
// embeddings and pp > 1 both the first and the last stage hold model.embed_tokens.weight). Every
// parameter is a Param: a canonical HF name, its global shape and the Box of it this process
// holds (the whole tensor, or this TP rank's box from LlamaShardingRules::place), with value and
// gradient buffers of the box's extent. Tensor parallelism: trainer/model/layer_decoder.h (layers) and
// trainer/model/tp_ops.h (vocab-parallel embedding, head and cross-entropy).
// Thread safety: a Model is used by one thread at a time (BLAS may use several internally).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "converters/model/llama_config.h"
#include "formats/base/status.h"
#include "formats/tensor/region.h"
#include "reshard/dist/comm.h"
#include "reshard/layout/layout.h"
#include "trainer/model/layer_decoder.h"
#include "trainer/model/tp_ops.h"

namespace ckpt::trainer {

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
  // Expert parallel layouts (layout.expert_parallel(), MoE models): the pipeline (DP rank) and
  // the rank's expert groups (not owned); the expert boxes then come from place_in_layout.
  int dp_rank = 0;
  ExpertGroups* experts = nullptr;
};

template <class T>
class Model {
 public:
  // Validates the config for this trainer (no biases, even head_dim, sizes that fit memory and
  // int64 arithmetic) and allocates zeroed parameters.
  static Result<Model> create(const LlamaConfig& c, StageRange stage = {});
  // A shard under a layout. Refuses (LayoutRefused, naming the numbers) tp not dividing the
  // attention heads, the KV heads or intermediate_size; an MoE stage with expert parallelism or
  // tp > 1 needs shard.experts (InvalidArgument). Allocates only this rank's boxes.
  static Result<Model> create(const LlamaConfig& c, const ModelShard& shard);

  // Pipeline-stage interface: 1F1B keeps several micro-batches in flight; `slot` in [0, slots)
  // names the saved activations of one of them. set_slots(k) before the first stage_forward.
  void set_slots(int k);
  int slots() const { return static_cast<int>(slots_.size()); }
  // Forward of one micro-batch (b sequences of seq tokens) through this stage.
  // First stage: `tokens` [b*seq] (x_in ignored); other stages: x_in [b*seq, D] from the previous
  // stage. Not the last stage: x_out [b*seq, D] receives the output, returns 0.
  // Last stage: `targets` [b*seq]; returns the SUM of the token losses (vocab-parallel
  // cross-entropy, identical on every TP rank) and keeps loss_scale * d(sum)/d(logits) for
  // stage_backward (x_out unused). Tokens and targets are checked against the vocabulary.
  // x_in, tokens and targets may be reused once it returns (the stage keeps copies). Errors: bad
  // arguments (slot outside [0, slots) or still waiting for its backward, ids outside the
  // vocabulary, missing buffers) and the TP group's failures, as Status; the slot is then free.
  Result<double> stage_forward(int slot, const int32_t* tokens, const T* x_in, const int32_t* targets,
                               int64_t b, int64_t seq, T loss_scale, T* x_out);
  // Backward of the micro-batch in `slot`. dx_out [b*seq, D] = d(loss)/d(x_out) from the next
  // stage (ignored on the last stage). dx_in [b*seq, D] receives d(loss)/d(x_in) (ignored on the
  // first stage, which accumulates the embedding gradient instead). Parameter gradients
  // accumulate (+=) into Param::g. The slot may be reused afterwards.
  Status stage_backward(int slot, const T* dx_out, T* dx_in);
  // MoE (docs/MOE.md, pipeline stages): the load-balancing loss pools every MoE layer of a
  // micro-batch, so its statistics cross the stage boundaries with the activations. With an MoE
  // config, x_in and x_out hold n*D + forward_tail() elements: after the activations, the
  // micro-batch's RouterTotals over the MoE layers of the stages so far (count[E], psum[E], rows,
  // as float64 bytes; the first stage starts from zero, a stage without MoE layers passes them on);
  // dx_out and dx_in hold n*D + backward_tail(): after the gradient, aux_dp[E], which the last
  // stage computes from the global totals and every stage's MoE layers use in backward. Both 0
  // for a dense model (the buffers are then [n, D]).
  int64_t forward_tail() const;
  int64_t backward_tail() const;
  int64_t layer_begin() const { return layer_begin_; }
  int64_t layer_end() const { return layer_end_; }

  const LlamaConfig& config() const { return cfg_; }
  bool has_embedding() const { return layer_begin_ == 0; }
  bool has_head() const { return layer_end_ == cfg_.num_hidden_layers; }
  // Vocabulary rows of the embedding / head held here (the whole vocabulary when tp == 1).
  VocabRange vocab_range() const { return vocab_; }
  int tp_size() const { return tp_.size; }
  // MoE: the load-balancing loss (transformers' aux_loss, before its coefficient) of the last
  // forward; 0 for a dense model.
  double last_aux_loss() const { return last_aux_; }
  // MoE: the router's load since the last call, max / mean tokens per expert of the most
  // unbalanced MoE layer (0 for a dense model); restarts the count.
  double take_router_load();
  // The tokens per expert of every layer since the last call ([num_hidden_layers * E], by global
  // layer, zero outside this stage's MoE layers; this rank's own tokens; restarts the count), and
  // (expert parallel, else 0) the seconds spent in
  // the MoE dispatch / combine collectives since the last call.
  std::vector<double> take_router_counts();
  double take_a2a_s() { return tp_.experts ? tp_.experts->take_a2a_s() : 0.0; }
  bool expert_parallel() const { return tp_.experts != nullptr; }
  int tp_rank() const { return tp_.rank; }

  // Every parameter held, in canonical order (llama_model_tensors). With tied embeddings the
  // head is model.embed_tokens.weight (listed once).
  std::vector<Param<T>*> params();
  Param<T>* find(const std::string& name);
  // init_box of every parameter from `seed` (layout independent).
  Status init(uint64_t seed);
  void zero_grad();
  int64_t num_params() const;

  // One-process forward_backward / forward (the whole model, any TP; they use activation slot 0).
  // Forward (and backward) of one micro-batch: tokens, targets [b, seq]. Returns the SUM of the
  // token losses. Gradients are accumulated (+=) as loss_scale * d(sum)/d(param); the trainer
  // passes loss_scale = 1 / (tokens of the whole step) so that the step's loss is the mean.
  // Errors: tokens or targets outside [0, vocab), sizes too large.
  Result<double> forward_backward(const int32_t* tokens, const int32_t* targets, int64_t b,
                                  int64_t seq, T loss_scale);
  // Forward only. logits (if non-null) receives [b*seq, V] (with tp > 1: the columns of this rank's
  // vocabulary range, vocab_range()). Returns the sum of token losses when
  // targets is non-null, else 0.
  Result<double> forward(const int32_t* tokens, const int32_t* targets, int64_t b, int64_t seq,
                         std::vector<T>* logits);

  // Model FLOPs of one training token (forward + backward = 3 x forward matmul FLOPs):
  // 6 * (linear weights a token runs through, incl. head; an MoE layer: router, top-k experts, shared
  // expert) + 12 * layers * seq * H * hd (scores and P*V, full square).
  // Counts this stage's layers (and head) whole: with tp > 1, the FLOPs of all its TP ranks together.
  double train_flops_per_token(int64_t seq) const;

 private:
  // Saved activations of one micro-batch of this stage (n = b * seq rows).
  struct SlotActs {
    bool live = false;            // forward done, backward pending
    int64_t b = 0, seq = 0;
    std::vector<int32_t> tokens;  // [n] (first stage: the embedding backward)
    std::vector<T> resid;         // [(layers + 1) * n * D] the residual stream at every layer boundary
    std::vector<T> xf, rstdf;     // [n, D], [n] final norm output (last stage)
    std::vector<T> logits;        // [n, Vl] (last stage; dlogits after stage_forward with grads)
    RouterTotals router;          // MoE: router statistics over the stage's MoE layers
    std::vector<T> aux_dp;        // [E] MoE: d(loss)/d(router probability) of the load-balancing loss
  };

  Model() = default;
  static Result<Model> build(const LlamaConfig& c, int64_t begin, int64_t end, const ModelShard* shard);
  Status check_batch(const int32_t* tokens, const int32_t* targets, int64_t b, int64_t seq) const;
  Status check_stage_call(int slot, const int32_t* tokens, const T* x_in, const int32_t* targets, int64_t b,
                          int64_t seq, T* x_out) const;
  // The forward of stage_forward; grads: keep loss_scale * dlogits for backward.
  Result<double> run_forward(int slot, const int32_t* tokens, const T* x_in, const int32_t* targets, int64_t b,
                             int64_t seq, T loss_scale, T* x_out, bool grads);
  Status head_backward(SlotActs& s, T* dx);  // dx [n, D] = d(loss)/d(last layer output)
  double moe_aux(SlotActs& s, T loss_scale);  // the slot's load-balancing loss term (sum form)
  Status tp_sum(T* buf, int64_t n);
  void ensure_rope(int64_t seq);
  Param<T>& head() { return cfg_.tie_word_embeddings ? embed_ : lm_head_; }

  LlamaConfig cfg_;
  double aux_coef_ = 0;             // MoE: router_aux_loss_coef
  double last_aux_ = 0;             // MoE: the load-balancing loss of the last forward
  int64_t layer_begin_ = 0, layer_end_ = 0;
  TpPart tp_;
  VocabRange vocab_;                // rows of the embedding / head held here
  bool holds_embed_ = false;        // first stage, or last stage with tied embeddings
  Param<T> embed_;                  // [V, D] (rows vocab_)
  std::vector<DecoderLayer<T>> layers_;
  Param<T> norm_;                   // [D]
  Param<T> lm_head_;                // [V, D] (rows vocab_; unused when tied)
  Workspace<T> ws_;
  std::vector<T> cos_, sin_;        // [seq, hd/2]
  int64_t rope_seq_ = -1;
  std::vector<SlotActs> slots_ = std::vector<SlotActs>(1);
};

}  // namespace ckpt::trainer
