#include "trainer/model/model.h"

#include <algorithm>
#include <cstring>

#include "converters/model/llama_sharding.h"
#include "formats/base/checked.h"
#include "reshard/layout/tensor_placement.h"
#include "trainer/model/init.h"
#include "trainer/model/ops.h"

namespace ckpt::trainer {

namespace {
// The reference trainer keeps everything in memory: refuse configs whose parameters (value +
// gradient + two Adam moments) or activations would not fit any machine it runs on.
constexpr int64_t kMaxParamElems = int64_t{4} << 30;       // 4 Gi elements per tensor set
constexpr int64_t kMaxActivationElems = int64_t{2} << 30;  // per buffer


// The MoE families this trainer runs: Mixtral, Qwen2-MoE, Qwen3-MoE (not DeepSeek-V3's MLA and
// biased router).
Status check_moe_config(const LlamaConfig& c) {
  if (c.mla || (c.moe && c.moe->router_bias))
    return Status::Error("UnsupportedModel", std::string("ckpt train does not support ") + model_type_name(c.family) +
                                                 " models (multi-head latent attention, the router's score bias); it "
                                                 "trains llama, mixtral, qwen2_moe and qwen3_moe");
  if (!c.moe) return Status::Ok();
  CKPT_RETURN_IF_ERROR(router_aux_loss_coef(c).status());
  const int64_t rows = c.moe->top_k * std::max(c.moe->expert_intermediate, c.hidden_size);
  if (rows > kMaxActivationElems)
    return Status::InvalidArgument("model config: num_experts_per_tok x expert width too large for the trainer");
  return Status::Ok();
}

// The model checks of this trainer (no biases but Qwen2-MoE's q/k/v, even head_dim, sizes that
// fit memory and int64).
Status check_config(const LlamaConfig& c) {
  if (c.attention_bias || c.mlp_bias)
    return Status::Unsupported("the reference trainer has no bias support (attention_bias / mlp_bias must be false)");
  CKPT_RETURN_IF_ERROR(check_moe_config(c));
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
  return Status::Ok();
}

// The layout checks of a shard: the structure (LlamaShardingRules), the ranks, the TP group, and
// what this trainer does not do (KV heads replicated over TP ranks).
Status check_shard(const LlamaConfig& c, const ModelShard& s) {
  const Layout& l = s.layout;
  const int tp = l.tp;
  auto refuse = [](const std::string& m) { return Status::Error("LayoutRefused", m); };
  if (tp >= 1) {
    if (c.num_attention_heads % tp != 0)
      return refuse("tp=" + std::to_string(tp) + " does not divide num_attention_heads=" +
                    std::to_string(c.num_attention_heads));
    if (c.num_key_value_heads % tp != 0)
      return refuse("tp=" + std::to_string(tp) + " does not divide num_key_value_heads=" +
                    std::to_string(c.num_key_value_heads) + " (the trainer does not replicate KV heads)");
    if (c.intermediate_size % tp != 0)
      return refuse("tp=" + std::to_string(tp) + " does not divide intermediate_size=" +
                    std::to_string(c.intermediate_size));
  }
  // Expert groups (trainer/model/moe_dispatch.h: expert parallel, or the experts' width over TP).
  const bool ep = c.moe && stage_uses_expert_groups(l);
  if (ep && !s.experts)
    return Status::InvalidArgument("model shard of " + l.to_string() + " needs its expert groups");
  CKPT_RETURN_IF_ERROR(LlamaShardingRules(c).check_layout(l));
  if (s.pp_rank < 0 || s.pp_rank >= l.pp || s.tp_rank < 0 || s.tp_rank >= tp)
    return Status::InvalidArgument("model shard pp_rank=" + std::to_string(s.pp_rank) + " tp_rank=" +
                                   std::to_string(s.tp_rank) + " outside the layout " + l.to_string());
  if (tp > 1 && (!s.tp || s.tp->size() != tp || s.tp->rank() != s.tp_rank))
    return Status::InvalidArgument("model shard with tp=" + std::to_string(tp) + " needs a TP communicator of " +
                                   std::to_string(tp) + " ranks in which it is rank " +
                                   std::to_string(s.tp_rank));
  return Status::Ok();
}
}  // namespace

template <class T>
Result<Model<T>> Model<T>::create(const LlamaConfig& c, StageRange stage) {
  CKPT_RETURN_IF_ERROR(check_config(c));
  const int64_t L = c.num_hidden_layers;
  const int64_t end = stage.layer_end < 0 ? L : stage.layer_end;
  if (stage.layer_begin < 0 || stage.layer_begin >= end || end > L)
    return Status::InvalidArgument("stage layers [" + std::to_string(stage.layer_begin) + ", " +
                                   std::to_string(end) + ") not inside [0, " + std::to_string(L) + ")");
  return build(c, stage.layer_begin, end, nullptr);
}

template <class T>
Result<Model<T>> Model<T>::create(const LlamaConfig& c, const ModelShard& shard) {
  CKPT_RETURN_IF_ERROR(check_config(c));
  CKPT_RETURN_IF_ERROR(check_shard(c, shard));
  const int64_t begin = shard.layout.first_layer(shard.pp_rank);
  return build(c, begin, begin + shard.layout.layers_in_stage(shard.pp_rank), &shard);
}

template <class T>
Result<Model<T>> Model<T>::build(const LlamaConfig& c, int64_t begin, int64_t end, const ModelShard* shard) {
  const bool tp = shard && shard->layout.tp > 1;
  ExpertGroups* experts = shard ? shard->experts : nullptr;
  const LlamaShardingRules rules(c);
  // The box this rank holds of parameter `name` (one definition with the store).
  auto box_of = [&](const std::string& name, const Shape& shape) -> Result<Box> {
    if (experts) {  // expert boxes depend on the pipeline: the placement of this (pipeline, stage)
      CKPT_ASSIGN_OR_RETURN(auto places, place_in_layout(TensorMeta{name, DType::kF32, shape}, shard->layout, rules));
      const int view_pipeline = shard->layout.dp == 1 ? 0 : shard->dp_rank;  // the view's (non-uniform: dp 1)
      for (const StagePlacement& sp : places)
        if (sp.expert && sp.pipeline == view_pipeline && sp.stage == shard->pp_rank)
          return sp.tp_boxes.at(static_cast<size_t>(shard->tp_rank));
    }
    if (!tp) return Box::whole(shape);
    CKPT_ASSIGN_OR_RETURN(TensorPlacement pl, rules.place(TensorMeta{name, DType::kF32, shape}, shard->layout));
    return pl.tp_boxes[static_cast<size_t>(shard->tp_rank)];
  };
  Model m;
  m.cfg_ = c;
  m.layer_begin_ = begin;
  m.layer_end_ = end;
  if (tp) m.tp_ = TpPart{shard->layout.tp, shard->tp_rank, shard->tp};
  m.tp_.experts = experts;
  const Shape vshape{c.vocab_size, c.hidden_size};
  CKPT_ASSIGN_OR_RETURN(Box vbox, box_of("model.embed_tokens.weight", vshape));
  m.vocab_ = VocabRange{vbox.offset[0], vbox.offset[0] + vbox.extent[0]};
  m.holds_embed_ = m.has_embedding() || (m.has_head() && c.tie_word_embeddings);
  if (m.holds_embed_) m.embed_.allocate("model.embed_tokens.weight", vshape, vbox, true);
  m.layers_.reserve(static_cast<size_t>(end - begin));
  const auto specs = DecoderLayer<T>::layer_specs(c);
  for (int64_t i = begin; i < end; ++i) {
    std::vector<Box> boxes;
    for (const auto& [name, shape] : specs[static_cast<size_t>(i)]) {
      CKPT_ASSIGN_OR_RETURN(Box b, box_of(name, shape));
      boxes.push_back(std::move(b));
    }
    m.layers_.emplace_back(c, i, m.tp_, boxes, specs[static_cast<size_t>(i)]);
  }
  if (c.moe) {
    CKPT_ASSIGN_OR_RETURN(m.aux_coef_, router_aux_loss_coef(c));
  }
  if (m.has_head()) {
    m.norm_.allocate("model.norm.weight", {c.hidden_size}, false);
    m.norm_.tp_replicated = tp;
    if (!c.tie_word_embeddings) {
      CKPT_ASSIGN_OR_RETURN(Box hbox, box_of("lm_head.weight", vshape));
      m.lm_head_.allocate("lm_head.weight", vshape, hbox, true);
    }
  }
  return m;
}

template <class T>
void Model<T>::set_slots(int k) {
  k = std::max(k, 1);
  slots_.resize(static_cast<size_t>(k));
  for (auto& l : layers_) l.set_slots(k);
}

template <class T>
std::vector<Param<T>*> Model<T>::params() {
  std::vector<Param<T>*> out;
  if (holds_embed_) out.push_back(&embed_);
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
double Model<T>::take_router_load() {
  double worst = 0;
  for (auto& l : layers_)
    if (l.is_moe()) worst = std::max(worst, l.moe.take_load());
  return worst;
}

template <class T>
std::vector<double> Model<T>::take_router_counts() {
  const size_t E = cfg_.moe ? static_cast<size_t>(cfg_.moe->num_experts) : 0;
  std::vector<double> out(static_cast<size_t>(cfg_.num_hidden_layers) * E, 0.0);
  for (size_t i = 0; i < layers_.size(); ++i)
    if (layers_[i].is_moe()) {
      const std::vector<double> c = layers_[i].moe.take_counts();
      std::copy(c.begin(), c.end(), out.begin() + static_cast<std::ptrdiff_t>((static_cast<size_t>(layer_begin_) + i) * E));
    }
  return out;
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
  double linear = L * (D * Q + 2 * D * KV + Q * D);
  for (int64_t i = layer_begin_; i < layer_end_; ++i) {
    if (!c.moe || !c.moe->is_moe_layer(i)) {
      linear += 3 * D * F;
      continue;
    }
    // Router, the top-k experts each token runs, the shared expert (and its gate).
    const MoeConfig& m = *c.moe;
    linear += D * static_cast<double>(m.num_experts + 3 * m.top_k * m.expert_intermediate + 3 * m.shared_intermediate);
  }
  if (has_head()) linear += static_cast<double>(c.vocab_size) * D;
  return 6.0 * linear + 12.0 * L * static_cast<double>(seq) * Q;
}

namespace {
// Every id of ids[n] inside [0, vocab), else an error naming the first one outside.
Status check_ids(const int32_t* ids, int64_t n, int64_t vocab, const char* what) {
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      return Status::InvalidArgument(std::string(what) + " " + std::to_string(ids[i]) + " at position " +
                                     std::to_string(i) + " outside the vocabulary [0, " + std::to_string(vocab) +
                                     ")");
  return Status::Ok();
}

// Micro-batch sizes: positive, within max_position_embeddings and the activation limit.
Status check_sizes(const LlamaConfig& c, int64_t b, int64_t seq) {
  if (b <= 0 || seq <= 0) return Status::InvalidArgument("batch and sequence length must be positive");
  if (seq > c.max_position_embeddings)
    return Status::InvalidArgument("sequence length " + std::to_string(seq) + " exceeds max_position_embeddings " +
                                   std::to_string(c.max_position_embeddings));
  auto n = checked_mul(b, seq);
  const int64_t widest = std::max({c.hidden_size, c.intermediate_size, c.vocab_size,
                                   c.num_attention_heads * c.head_dim});
  auto a1 = n ? checked_mul(*n, widest) : std::nullopt;
  auto a2 = n ? checked_mul(*n, c.num_attention_heads * seq) : std::nullopt;
  auto a3 = n && c.moe ? checked_mul(*n, c.moe->top_k * std::max(c.moe->expert_intermediate, c.hidden_size)) : a1;
  if (!a1 || !a2 || !a3 || *a1 > kMaxActivationElems || *a2 > kMaxActivationElems || *a3 > kMaxActivationElems)
    return Status::InvalidArgument("micro-batch " + std::to_string(b) + " x " + std::to_string(seq) +
                                   " needs activation buffers beyond the trainer's limit");
  return Status::Ok();
}
}  // namespace

template <class T>
Status Model<T>::check_batch(const int32_t* tokens, const int32_t* targets, int64_t b, int64_t seq) const {
  CKPT_RETURN_IF_ERROR(check_sizes(cfg_, b, seq));
  CKPT_RETURN_IF_ERROR(check_ids(tokens, b * seq, cfg_.vocab_size, "token"));
  if (targets) CKPT_RETURN_IF_ERROR(check_ids(targets, b * seq, cfg_.vocab_size, "target"));
  if (!has_embedding() || !has_head())
    return Status::Unsupported("a partial pipeline stage needs the parallel trainer (stage_forward)");
  return Status::Ok();
}

template <class T>
Status Model<T>::check_stage_call(int slot, const int32_t* tokens, const T* x_in, const int32_t* targets,
                                  int64_t b, int64_t seq, T* x_out) const {
  if (slot < 0 || slot >= static_cast<int>(slots_.size()))
    return Status::InvalidArgument("activation slot " + std::to_string(slot) + " outside [0, " +
                                   std::to_string(slots_.size()) + ") (set_slots)");
  if (slots_[static_cast<size_t>(slot)].live)
    return Status::InvalidArgument("activation slot " + std::to_string(slot) +
                                   " still holds a micro-batch waiting for its backward");
  CKPT_RETURN_IF_ERROR(check_sizes(cfg_, b, seq));
  if (has_embedding()) {
    if (!tokens) return Status::InvalidArgument("the first pipeline stage needs tokens");
    CKPT_RETURN_IF_ERROR(check_ids(tokens, b * seq, cfg_.vocab_size, "token"));
  } else if (!x_in) {
    return Status::InvalidArgument("a pipeline stage after the first needs its input activations");
  }
  if (has_head()) {
    if (!targets) return Status::InvalidArgument("the last pipeline stage needs targets");
    CKPT_RETURN_IF_ERROR(check_ids(targets, b * seq, cfg_.vocab_size, "target"));
  } else if (!x_out) {
    return Status::InvalidArgument("a pipeline stage before the last needs an output buffer");
  }
  return Status::Ok();
}

// The members defined here (model_stage.cc defines and instantiates the others; one explicit
// instantiation per member, so that unity and separate builds both link).
#define CKPT_INSTANTIATE_MODEL(T)                                                                          \
  template Result<Model<T>> Model<T>::create(const LlamaConfig&, StageRange);                               \
  template Result<Model<T>> Model<T>::create(const LlamaConfig&, const ModelShard&);                        \
  template Result<Model<T>> Model<T>::build(const LlamaConfig&, int64_t, int64_t, const ModelShard*);       \
  template void Model<T>::set_slots(int);                                                                   \
  template std::vector<Param<T>*> Model<T>::params();                                                       \
  template Param<T>* Model<T>::find(const std::string&);                                                    \
  template Status Model<T>::init(uint64_t);                                                                 \
  template void Model<T>::zero_grad();                                                                      \
  template int64_t Model<T>::num_params() const;                                                            \
  template double Model<T>::take_router_load();                                                            \
  template std::vector<double> Model<T>::take_router_counts();                                             \
  template double Model<T>::train_flops_per_token(int64_t) const;                                           \
  template Status Model<T>::check_batch(const int32_t*, const int32_t*, int64_t, int64_t) const;            \
  template Status Model<T>::check_stage_call(int, const int32_t*, const T*, const int32_t*, int64_t,        \
                                             int64_t, T*) const;
CKPT_INSTANTIATE_MODEL(float)
CKPT_INSTANTIATE_MODEL(double)
#undef CKPT_INSTANTIATE_MODEL

}  // namespace ckpt::trainer
