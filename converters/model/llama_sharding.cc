#include "converters/model/llama_sharding.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <utility>

#include "converters/model/tp_split.h"

namespace ckpt {

namespace {

Status refuse(const std::string& msg) {
  return Status::Error("LayoutRefused", msg);
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Even split of dim `dim` over tp ranks (the caller checked divisibility).
std::vector<Box> split_even(const Shape& shape, size_t dim, int tp) {
  std::vector<Box> out;
  const int64_t part = shape[dim] / tp;
  for (int r = 0; r < tp; ++r) out.push_back(dim_slice(shape, dim, r * part, (r + 1) * part));
  return out;
}

std::vector<Box> replicate(const Shape& shape, int tp) { return std::vector<Box>(tp, Box::whole(shape)); }

constexpr std::string_view kOptimizerKinds[] = {"optimizer.exp_avg.", "optimizer.exp_avg_sq.",
                                                "optimizer.fp32_param."};

}  // namespace

LlamaShardingRules::LlamaShardingRules(LlamaConfig config) : config_(std::move(config)) {
  for (const auto& t : llama_model_tensors(config_, DType::kF32)) shapes_[t.name] = t.shape;
}

int64_t LlamaShardingRules::kv_replication(int64_t num_kv_heads, int tp) {
  if (tp <= 0 || num_kv_heads <= 0) return 1;
  if (num_kv_heads % tp == 0) return 1;
  if (tp > num_kv_heads && tp % num_kv_heads == 0) return tp / num_kv_heads;
  return 0;  // not shardable
}

namespace {

// ep / etp against the model: only an MoE model takes them; ep divides the experts, etp their width;
// ZeRO-1 shards expert parameters over the expert data-parallel group (TensorPlacement::expert).
Status check_expert_layout(const LlamaConfig& c, const Layout& layout) {
  if (!layout.expert_parallel()) return Status::Ok();
  const std::string lay = "ep=" + std::to_string(layout.ep) + " etp=" + std::to_string(layout.expert_tp());
  if (!c.moe) return refuse(lay + " for a dense model (expert parallelism needs an MoE model)");
  if (c.moe->num_experts % layout.ep != 0)
    return refuse("ep=" + std::to_string(layout.ep) + " does not divide the " + std::to_string(c.moe->num_experts) + " experts");
  if (c.moe->expert_intermediate % layout.expert_tp() != 0)
    return refuse("etp=" + std::to_string(layout.expert_tp()) + " does not divide the experts' width " +
                  std::to_string(c.moe->expert_intermediate));
  return Status::Ok();
}

// The boxes of the `tp` ranks of pipeline layout.view_pipeline for a stacked expert tensor [E, ...]
// whose width (F) is dimension `fdim` (kNoWidth: none, whole on every etp rank): stage-local rank r = pipeline * tp + t is expert TP rank
// r % etp and expert-parallel rank (r / etp) % ep (Megatron-Core's expert rank order).
constexpr size_t kNoWidth = SIZE_MAX;

Result<std::vector<Box>> expert_boxes(const Shape& shape, size_t fdim, const Layout& layout, const std::string& full) {
  if (layout.view_pipeline < 0 || layout.view_pipeline >= layout.dp)
    return Status::Internal("expert placement of '" + full + "' asked without its pipeline").with_tensor(full);
  const int etp = layout.expert_tp();
  const int64_t local = shape[0] / layout.ep, width = fdim == kNoWidth ? 0 : shape[fdim] / etp;
  std::vector<Box> boxes;
  for (int t = 0; t < layout.tp; ++t) {
    const Layout::ExpertCoord ec = layout.expert_coord(layout.view_pipeline, t);
    const int64_t er = ec.etp, xr = ec.ep;
    Box b = Box::whole(shape);
    b.offset[0] = xr * local;
    b.extent[0] = local;
    if (fdim != kNoWidth) {
      b.offset[fdim] = er * width;
      b.extent[fdim] = width;
    }
    boxes.push_back(std::move(b));
  }
  return boxes;
}

}  // namespace

Status LlamaShardingRules::check_layout(const Layout& layout) const {
  const LlamaConfig& c = config_;
  const int64_t L = c.num_hidden_layers;
  if (layout.tp < 1 || layout.pp < 1 || layout.dp < 1)
    return refuse("tp, pp and dp must be >= 1, got tp=" + std::to_string(layout.tp) + " pp=" +
                  std::to_string(layout.pp) + " dp=" + std::to_string(layout.dp));
  if (static_cast<int64_t>(layout.stage_of_layer.size()) != L)
    return refuse("layout has " + std::to_string(layout.stage_of_layer.size()) +
                  " layers, the model config has num_hidden_layers=" + std::to_string(L));
  if (layout.pp > L)
    return refuse("pp=" + std::to_string(layout.pp) + " pipeline stages for only " + std::to_string(L) +
                  " layers (every stage needs at least one layer)");
  std::vector<int64_t> count(layout.pp, 0);
  for (int64_t i = 0; i < L; ++i) {
    const int s = layout.stage_of_layer[i];
    if (s < 0 || s >= layout.pp)
      return refuse("layer " + std::to_string(i) + " is on stage " + std::to_string(s) + ", expected 0.." +
                    std::to_string(layout.pp - 1));
    if (i > 0 && s < layout.stage_of_layer[i - 1])
      return refuse("layer " + std::to_string(i) + " is on stage " + std::to_string(s) + " after layer " +
                    std::to_string(i - 1) + " on stage " + std::to_string(layout.stage_of_layer[i - 1]) +
                    " (stages must hold contiguous, increasing layer ranges)");
    ++count[s];
  }
  for (int s = 0; s < layout.pp; ++s)
    if (count[s] == 0) return refuse("pipeline stage " + std::to_string(s) + " holds no layer");
  const int tp = layout.tp;
  const int64_t H = c.num_attention_heads, K = c.num_key_value_heads;
  if (H % tp != 0)
    return refuse("tp=" + std::to_string(tp) + " does not divide num_attention_heads=" + std::to_string(H));
  if (kv_replication(K, tp) == 0)
    return refuse("tp=" + std::to_string(tp) + " and num_key_value_heads=" + std::to_string(K) +
                  ": tp must divide the KV heads, or be a multiple of them (each KV head then replicated on tp/K "
                  "ranks)");
  const bool dense_layers = !c.moe || std::find(c.moe->moe_layer.begin(), c.moe->moe_layer.end(), false) !=
                                            c.moe->moe_layer.end();
  if (dense_layers && c.intermediate_size % tp != 0)
    return refuse("tp=" + std::to_string(tp) + " does not divide intermediate_size=" +
                  std::to_string(c.intermediate_size));
  if (c.moe && c.moe->expert_intermediate % tp != 0)
    return refuse("tp=" + std::to_string(tp) + " does not divide the experts' width " +
                  std::to_string(c.moe->expert_intermediate) + " (moe_intermediate_size; experts split it over tp)");
  if (c.moe && c.moe->shared_intermediate % tp != 0)
    return refuse("tp=" + std::to_string(tp) + " does not divide shared_expert_intermediate_size=" +
                  std::to_string(c.moe->shared_intermediate));
  CKPT_RETURN_IF_ERROR(check_expert_layout(c, layout));
  if (layout.vocab_divisor < 1)
    return refuse("vocab_divisor must be >= 1, got " + std::to_string(layout.vocab_divisor));
  return Status::Ok();
}

namespace {

// The model parameter a name stands for: `full` itself, or the parameter of an optimizer tensor
// `optimizer.{exp_avg,exp_avg_sq,fp32_param}.<param>` (then *optimizer = true).
Result<std::string> parameter_of(const std::string& full, bool* optimizer) {
  *optimizer = false;
  if (!full.starts_with("optimizer.")) return full;
  for (std::string_view k : kOptimizerKinds)
    if (full.starts_with(k)) {
      *optimizer = true;
      return full.substr(k.size());
    }
  return Status::Error("UnknownTensor",
                       "unknown optimizer tensor '" + full +
                           "' (expected optimizer.{exp_avg,exp_avg_sq,fp32_param}.<parameter>)")
      .with_tensor(full);
}

// Pipeline stages holding parameter `name` (tensor `full`).
Result<std::vector<int>> stages_of(const LlamaConfig& c, const std::string& full, const std::string& name,
                                   const Layout& layout) {
  const int last = layout.pp - 1;
  const int64_t layer = llama_layer_of(name);
  if (layer >= 0) {
    if (layer >= static_cast<int64_t>(layout.stage_of_layer.size()))
      return Status::Error("LayoutRefused",
                           "tensor '" + full + "' is in layer " + std::to_string(layer) + " but the layout has " +
                               std::to_string(layout.stage_of_layer.size()) + " layers")
          .with_tensor(full);
    return std::vector<int>{layout.stage_of_layer[layer]};
  }
  if (name == "model.embed_tokens.weight") {
    std::vector<int> stages{0};
    if (c.tie_word_embeddings && last > 0) stages.push_back(last);
    return stages;
  }
  return std::vector<int>{last};  // model.norm.weight, lm_head.weight
}

// gpt-oss's own tensors (moe_config.h): the sinks split by heads, the router replicated, the experts
// as the stacked experts of the other families, their width split over etp (tp without expert
// parallelism): gate_up_proj [E, h, 2F] along its last dim, where gate and up are interleaved, so
// a contiguous range holds the gate and up rows of the same features; the down projection's
// bias [E, h] whole on every etp rank (added after the reduction, as a dense o_proj's bias).
Result<std::vector<Box>> gpt_oss_boxes(const LlamaConfig& c, const std::string& full, const std::string& name, const Shape& shape,
                                       const Layout& layout) {
  const int tp = layout.tp;
  if (name.ends_with("self_attn.sinks")) {
    if (c.num_attention_heads % tp != 0)
      return Status::Error("LayoutRefused", "tensor '" + full + "': tp=" + std::to_string(tp) + " does not divide the heads").with_tensor(full);
    return split_even(shape, 0, tp);
  }
  if (name.ends_with("mlp.router.weight") || name.ends_with("mlp.router.bias")) return replicate(shape, tp);
  const size_t fdim = name.ends_with("gate_up_proj") ? 2 : name.ends_with("down_proj_bias") ? kNoWidth : 1;
  if (layout.expert_parallel()) return expert_boxes(shape, fdim, layout, full);
  if (fdim == kNoWidth) return replicate(shape, tp);
  if (c.moe->expert_intermediate % tp != 0)  // F: gate_up_proj's 2F then splits into whole gate/up pairs
    return Status::Error("LayoutRefused", "tensor '" + full + "': tp=" + std::to_string(tp) + " does not divide the experts' width")
        .with_tensor(full);
  return split_even(shape, fdim, tp);
}

// The box of each TP rank of parameter `name` (tensor `full`, HF shape `shape`).
Result<std::vector<Box>> tp_boxes_of(const LlamaConfig& c, const std::string& full, const std::string& name,
                                     const Shape& shape, const Layout& layout) {
  const int tp = layout.tp;
  auto not_divisible = [&](int64_t n, const char* what) {
    return Status::Error("LayoutRefused",
                         "tensor '" + full + "': tp=" + std::to_string(tp) + " does not divide " + what + "=" +
                             std::to_string(n))
        .with_tensor(full);
  };
  auto is = [&](std::initializer_list<std::string_view> suffixes) {
    for (auto sfx : suffixes)
      if (ends_with(name, sfx)) return true;
    return false;
  };
  std::vector<Box> boxes;
  if (c.family == ModelFamily::kGptOss && is({"self_attn.sinks", "mlp.router.weight", "mlp.router.bias", "mlp.experts.gate_up_proj",
                                              "mlp.experts.gate_up_proj_bias", "mlp.experts.down_proj", "mlp.experts.down_proj_bias"}))
    return gpt_oss_boxes(c, full, name, shape, layout);
  if (name == "model.embed_tokens.weight" || name == "lm_head.weight") {
    for (int r = 0; r < tp; ++r) {
      CKPT_ASSIGN_OR_RETURN(VocabPart v, vocab_parallel_part(shape[0], layout.padded_vocab(shape[0]), tp, r));
      boxes.push_back(dim_slice(shape, 0, v.begin, v.end));
    }
  } else if (llama_is_norm(name) || is({"o_proj.bias", "down_proj.bias", "mlp.gate.weight", "shared_expert_gate.weight",
                                         "gate.e_score_correction_bias", "q_a_proj.weight", "kv_a_proj_with_mqa.weight"})) {
    boxes = replicate(shape, tp);  // norms, the MoE router and the shared expert's gate, MLA's down projections
  } else if (is({"q_b_proj.weight", "kv_b_proj.weight"})) {
    if (c.num_attention_heads % tp != 0) return not_divisible(c.num_attention_heads, "num_attention_heads");
    boxes = split_even(shape, 0, tp);  // MLA's up projections: rows per head
  } else if (layout.expert_parallel() && is({"mlp.experts.gate_proj.weight", "mlp.experts.up_proj.weight"})) {
    return expert_boxes(shape, 1, layout, full);
  } else if (layout.expert_parallel() && is({"mlp.experts.down_proj.weight"})) {
    return expert_boxes(shape, 2, layout, full);
  } else if (is({"mlp.experts.gate_proj.weight", "mlp.experts.up_proj.weight"})) {
    if (shape[1] % tp != 0) return not_divisible(shape[1], "moe_intermediate_size");
    boxes = split_even(shape, 1, tp);  // [E, F, h]: every expert's F split as a dense MLP's
  } else if (is({"mlp.experts.down_proj.weight"})) {
    if (shape[2] % tp != 0) return not_divisible(shape[2], "moe_intermediate_size");
    boxes = split_even(shape, 2, tp);  // [E, h, F]
  } else if (is({"q_proj.weight", "q_proj.bias"})) {
    if (c.num_attention_heads % tp != 0) return not_divisible(c.num_attention_heads, "num_attention_heads");
    boxes = split_even(shape, 0, tp);
  } else if (is({"k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias"})) {
    const int64_t rep = LlamaShardingRules::kv_replication(c.num_key_value_heads, tp);
    if (rep == 0) return not_divisible(c.num_key_value_heads, "num_key_value_heads (and is not a multiple of it)");
    if (rep == 1) return split_even(shape, 0, tp);
    for (int r = 0; r < tp; ++r) {
      const int64_t head = r / rep;  // each KV head on rep consecutive ranks
      boxes.push_back(dim_slice(shape, 0, head * c.head_dim, (head + 1) * c.head_dim));
    }
  } else if (is({"gate_proj.weight", "gate_proj.bias", "up_proj.weight", "up_proj.bias"})) {
    if (shape[0] % tp != 0) return not_divisible(shape[0], "intermediate_size");
    boxes = split_even(shape, 0, tp);
  } else if (is({"o_proj.weight"})) {
    if (c.num_attention_heads % tp != 0) return not_divisible(c.num_attention_heads, "num_attention_heads");
    boxes = split_even(shape, 1, tp);
  } else if (is({"down_proj.weight"})) {
    if (shape[1] % tp != 0) return not_divisible(shape[1], "intermediate_size");
    boxes = split_even(shape, 1, tp);
  } else {
    return Status::Internal("no sharding rule for '" + full + "'").with_tensor(full);
  }
  return boxes;
}

}  // namespace

Result<TensorPlacement> LlamaShardingRules::place(const TensorMeta& tensor, const Layout& layout) const {
  const std::string& full = tensor.name;
  bool optimizer = false;
  CKPT_ASSIGN_OR_RETURN(const std::string name, parameter_of(full, &optimizer));
  auto it = shapes_.find(name);
  if (it == shapes_.end()) {
    std::string hint;
    if (name == "lm_head.weight" && config_.tie_word_embeddings)
      hint = " (the config ties word embeddings, so there is no separate lm_head)";
    return Status::Error("UnknownTensor",
                         "tensor '" + full + "' is not a tensor of this LLaMA model" + hint)
        .with_tensor(full);
  }
  const Shape& shape = it->second;
  if (tensor.shape != shape)
    return Status::Error("ShapeMismatch",
                         "tensor '" + full + "' has shape " + shape_to_string(tensor.shape) + ", the config expects " +
                             shape_to_string(shape))
        .with_tensor(full);
  if (layout.tp < 1 || layout.pp < 1)
    return Status::InvalidArgument("layout with tp=" + std::to_string(layout.tp) + " pp=" + std::to_string(layout.pp));
  TensorPlacement p;
  p.optimizer_state = optimizer;
  CKPT_ASSIGN_OR_RETURN(p.stages, stages_of(config_, full, name, layout));
  CKPT_ASSIGN_OR_RETURN(p.tp_boxes, tp_boxes_of(config_, full, name, shape, layout));
  p.expert = layout.expert_parallel() && name.find(".mlp.experts.") != std::string::npos;
  return p;
}

}  // namespace ckpt
