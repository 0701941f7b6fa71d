#include "converters/megatron/dist/megatron_dist_map.h"

#include <algorithm>
#include <map>

namespace ckpt {

namespace dist_map_detail {

constexpr const char* kLayerPrefix = "decoder.layers.";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// How a per-layer tensor is split over TP in the global (stacked) tensor.
enum class TpSplit { kReplicated, kRows, kCols, kGateUp };

TpSplit layer_split(const std::string& rest) {
  if (ends_with(rest, "layer_norm_weight") || ends_with(rest, "layer_norm_bias")) return TpSplit::kReplicated;
  if (rest.rfind("self_attention.linear_qkv.", 0) == 0) return TpSplit::kRows;
  if (rest.rfind("mlp.linear_fc1.", 0) == 0) return TpSplit::kGateUp;
  if (ends_with(rest, ".weight")) return TpSplit::kCols;  // linear_proj, linear_fc2
  return TpSplit::kReplicated;                             // their biases
}

struct Builder {
  std::vector<DistTensor> out;
  std::map<std::string, size_t> index;

  DistTensor& tensor(const std::string& key, const Shape& shape) {
    auto [it, fresh] = index.emplace(key, out.size());
    if (fresh) out.push_back(DistTensor{key, shape, {}});
    return out[it->second];
  }
};

Shape with_layer(int64_t layers, const Shape& s) {
  Shape r{layers};
  r.insert(r.end(), s.begin(), s.end());
  return r;
}

// A chunk [1, per-rank shape] at layer `g`, offset `off` along global dim `dim` (>= 1).
DistChunk layer_chunk(int64_t g, const Shape& shape, size_t dim, int64_t off, std::vector<MegatronSegment> segs,
                      int rank) {
  DistChunk c;
  c.box.offset = Shape(shape.size() + 1, 0);
  c.box.offset[0] = g;
  c.box.offset[dim] = off;
  c.box.extent = with_layer(1, shape);
  c.row_dim = 1;
  c.segments = std::move(segs);
  c.rank = rank;
  return c;
}

// One per-rank tensor of a decoder layer (local index in its name) into the stacked tensors.
Status add_layer_tensor(Builder& b, const LlamaConfig& c, const Layout& layout, const std::vector<int64_t>& stage_layers,
                        const MegatronTensor& t, int tp_r, int rank) {
  const std::string rest0 = t.name.substr(std::string(kLayerPrefix).size());
  const size_t dot = rest0.find('.');
  const int64_t local = std::stoll(rest0.substr(0, dot));
  if (local < 0 || local >= static_cast<int64_t>(stage_layers.size()))
    return Status::Internal("layer index of '" + t.name + "' outside its stage");
  const std::string rest = rest0.substr(dot + 1), key = kLayerPrefix + rest;
  const int64_t g = stage_layers[local], L = c.num_hidden_layers, tp = layout.tp;
  Shape gs = t.shape;
  switch (layer_split(rest)) {
    case TpSplit::kReplicated:
      b.tensor(key, with_layer(L, gs));
      if (tp_r == 0) b.tensor(key, {}).chunks.push_back(layer_chunk(g, t.shape, 1, 0, t.segments, rank));
      break;
    case TpSplit::kRows:
      gs[0] *= tp;
      b.tensor(key, with_layer(L, gs)).chunks.push_back(layer_chunk(g, t.shape, 1, tp_r * t.shape[0], t.segments, rank));
      break;
    case TpSplit::kCols:
      gs[1] *= tp;
      b.tensor(key, with_layer(L, gs)).chunks.push_back(layer_chunk(g, t.shape, 2, tp_r * t.shape[1], t.segments, rank));
      break;
    case TpSplit::kGateUp: {
      if (t.segments.size() != 2) return Status::Internal("linear_fc1 of a rank is not [gate; up]");
      gs[0] *= tp;
      DistTensor& d = b.tensor(key, with_layer(L, gs));
      Shape half = t.shape;
      half[0] /= 2;
      d.chunks.push_back(layer_chunk(g, half, 1, tp_r * half[0], {t.segments[0]}, rank));
      d.chunks.push_back(layer_chunk(g, half, 1, c.intermediate_size + tp_r * half[0], {t.segments[1]}, rank));
      break;
    }
  }
  return Status::Ok();
}

// A tensor outside the layers: vocab-parallel rows (embedding, output head) or replicated.
void add_outer_tensor(Builder& b, const Layout& layout, const MegatronTensor& t, int tp_r, int rank) {
  const bool vocab = t.name == "embedding.word_embeddings.weight" || t.name == "output_layer.weight";
  Shape gs = t.shape;
  if (vocab) gs[0] *= layout.tp;
  DistTensor& d = b.tensor(t.name, gs);
  if (!vocab && tp_r != 0) return;
  DistChunk ch;
  ch.box.offset = Shape(t.shape.size(), 0);
  if (vocab) ch.box.offset[0] = tp_r * t.shape[0];
  ch.box.extent = t.shape;
  ch.row_dim = 0;
  ch.segments = t.segments;
  ch.rank = rank;
  d.chunks.push_back(std::move(ch));
}

// A chunk of a per-layer (not stacked) MoE-model tensor at `off`, segments along `row_dim`.
DistChunk moe_chunk(Shape off, Shape extent, size_t row_dim, std::vector<MegatronSegment> segs, int rank) {
  DistChunk ch;
  ch.box = Box{std::move(off), std::move(extent)};
  ch.row_dim = row_dim;
  ch.segments = std::move(segs);
  ch.rank = rank;
  return ch;
}

// One per-rank tensor of an MoE model's layer: megatron-core saves such models one key per layer
// (decoder.layers.<global l>.<name>, non-homogeneous layers), the experts of a layer as one global
// tensor mlp.experts.experts.linear_fc1.weight [E, 2F, h] (gate rows [0, F), up rows [F, 2F) of
// each expert) and linear_fc2.weight [E, h, F]; pre_mlp_layernorm under the local spec's key
// mlp.linear_fc1.layer_norm_weight (`local_norm`) or TE's own; router, gate_weight and norms replicated.
Status add_moe_layer_tensor(Builder& b, const LlamaConfig& c, const Layout& layout, const std::vector<int64_t>& stage_layers,
                            const MegatronTensor& t, int tp_r, const MegatronRankPart& part, int rank, bool local_norm) {
  const std::string rest0 = t.name.substr(std::string(kLayerPrefix).size());
  const size_t dot = rest0.find('.');
  const int64_t local = std::stoll(rest0.substr(0, dot));
  if (local < 0 || local >= static_cast<int64_t>(stage_layers.size()))
    return Status::Internal("layer index of '" + t.name + "' outside its stage");
  std::string rest = rest0.substr(dot + 1);
  const std::string pre = kLayerPrefix + std::to_string(stage_layers[local]) + ".";
  const std::string le = "mlp.experts.local_experts.";
  if (rest.rfind(le, 0) == 0) {
    const int64_t E = c.moe->num_experts, F = c.moe->expert_intermediate, h = c.hidden_size;
    const size_t d2 = rest.find('.', le.size());
    const int64_t ge = part.ep_rank * (E / layout.ep) + std::stoll(rest.substr(le.size(), d2 - le.size()));
    const int64_t fp = F / layout.expert_tp(), f0 = part.etp_rank * fp;
    const std::string sub = rest.substr(d2 + 1), key = pre + "mlp.experts.experts." + sub;
    if (sub == "linear_fc1.weight" && t.segments.size() == 2) {
      DistTensor& d = b.tensor(key, {E, 2 * F, h});
      d.chunks.push_back(moe_chunk({ge, f0, 0}, {1, fp, h}, 1, {t.segments[0]}, rank));
      d.chunks.push_back(moe_chunk({ge, F + f0, 0}, {1, fp, h}, 1, {t.segments[1]}, rank));
    } else if (sub == "linear_fc2.weight") {
      b.tensor(key, {E, h, F}).chunks.push_back(moe_chunk({ge, 0, f0}, {1, h, fp}, 1, t.segments, rank));
    } else {
      return Status::Internal("unexpected expert tensor '" + t.name + "'");
    }
    return Status::Ok();
  }
  if (rest == "pre_mlp_layernorm.weight" && local_norm) rest = "mlp.linear_fc1.layer_norm_weight";
  const bool replicated = ends_with(rest, "layer_norm_weight") || rest == "pre_mlp_layernorm.weight" ||
                          rest.rfind("mlp.router.", 0) == 0 || rest == "mlp.shared_experts.gate_weight";
  const bool gate_up = rest == "mlp.linear_fc1.weight" || rest == "mlp.shared_experts.linear_fc1.weight";
  const TpSplit split = replicated ? TpSplit::kReplicated : gate_up ? TpSplit::kGateUp : layer_split(rest);
  Shape gs = t.shape;
  const size_t nd = gs.size();
  Shape off(nd, 0);
  DistTensor& d = b.tensor(pre + rest, {});
  switch (split) {
    case TpSplit::kReplicated:
      d.shape = gs;
      if (tp_r == 0) d.chunks.push_back(moe_chunk(off, t.shape, 0, t.segments, rank));
      break;
    case TpSplit::kRows:
    case TpSplit::kCols: {
      const size_t dim = split == TpSplit::kRows ? 0 : 1;
      gs[dim] *= layout.tp;
      d.shape = gs;
      off[dim] = tp_r * t.shape[dim];
      d.chunks.push_back(moe_chunk(off, t.shape, 0, t.segments, rank));
      break;
    }
    case TpSplit::kGateUp: {
      if (t.segments.size() != 2) return Status::Internal("linear_fc1 of a rank is not [gate; up]");
      const int64_t width = rest == "mlp.linear_fc1.weight" ? c.intermediate_size : c.moe->shared_intermediate;
      gs[0] *= layout.tp;
      d.shape = gs;
      Shape half = t.shape;
      half[0] /= 2;
      off[0] = tp_r * half[0];
      d.chunks.push_back(moe_chunk(off, half, 0, {t.segments[0]}, rank));
      off[0] = width + tp_r * half[0];
      d.chunks.push_back(moe_chunk(off, half, 0, {t.segments[1]}, rank));
      break;
    }
  }
  return Status::Ok();
}

// An MoE model's tensors: each stage's ranks r < max(tp, ep * etp) (Megatron-Core's expert order),
// the dense part from the first rank of each TP rank, the experts from the first of each expert rank.
Status add_moe_tensors(Builder& b, const LlamaConfig& c, const Layout& layout, bool local_norm) {
  const int n = std::max(layout.tp, layout.ep * layout.expert_tp());
  for (int p = 0; p < layout.pp; ++p) {
    std::vector<int64_t> stage_layers;
    for (int64_t i = 0; i < static_cast<int64_t>(layout.stage_of_layer.size()); ++i)
      if (layout.stage_of_layer[i] == p) stage_layers.push_back(i);
    for (int r = 0; r < n; ++r) {
      const int tp_r = r % layout.tp;
      const MegatronRankPart part{(r / layout.expert_tp()) % layout.ep, r % layout.expert_tp(), r < layout.tp,
                                  r < layout.ep * layout.expert_tp()};
      CKPT_ASSIGN_OR_RETURN(auto ts, megatron_rank_tensors(c, layout, tp_r, p, MegatronNormNames::kTransformerEngine, part));
      const int rank = p * n + r;
      for (const auto& t : ts) {
        if (t.name.rfind(kLayerPrefix, 0) == 0) {
          CKPT_RETURN_IF_ERROR(add_moe_layer_tensor(b, c, layout, stage_layers, t, tp_r, part, rank, local_norm));
        } else {
          add_outer_tensor(b, layout, t, tp_r, rank);
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace dist_map_detail

Result<std::vector<DistTensor>> megatron_dist_tensors(const LlamaConfig& c, const Layout& layout_in, MegatronNormNames norms) {
  using namespace dist_map_detail;
  CKPT_ASSIGN_OR_RETURN(const Layout layout, layout_in.as_symmetric("the Megatron torch_dist layout"));
  Builder b;
  if (c.moe) {
    CKPT_RETURN_IF_ERROR(add_moe_tensors(b, c, layout, norms == MegatronNormNames::kLocal));
    return std::move(b.out);
  }
  for (int p = 0; p < layout.pp; ++p) {
    std::vector<int64_t> stage_layers;
    for (int64_t i = 0; i < static_cast<int64_t>(layout.stage_of_layer.size()); ++i)
      if (layout.stage_of_layer[i] == p) stage_layers.push_back(i);
    for (int r = 0; r < layout.tp; ++r) {
      CKPT_ASSIGN_OR_RETURN(auto ts, megatron_rank_tensors(c, layout, r, p, MegatronNormNames::kTransformerEngine));
      const int rank = p * layout.tp + r;
      for (const auto& t : ts) {
        if (t.name.rfind(kLayerPrefix, 0) == 0) {
          CKPT_RETURN_IF_ERROR(add_layer_tensor(b, c, layout, stage_layers, t, r, rank));
        } else {
          add_outer_tensor(b, layout, t, r, rank);
        }
      }
    }
  }
  return std::move(b.out);
}

Box dist_segment_box(const DistChunk& chunk, size_t seg_index) {
  Box b = chunk.box;
  int64_t row = 0;
  for (size_t i = 0; i < seg_index; ++i) row += chunk.segments[i].rows();
  b.offset[chunk.row_dim] += row;
  b.extent[chunk.row_dim] = chunk.segments[seg_index].rows();
  return b;
}

}  // namespace ckpt
