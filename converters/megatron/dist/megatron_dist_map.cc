#include "converters/megatron/dist/megatron_dist_map.h"

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

}  // namespace dist_map_detail

Result<std::vector<DistTensor>> megatron_dist_tensors(const LlamaConfig& c, const Layout& layout_in) {
  using namespace dist_map_detail;
  CKPT_ASSIGN_OR_RETURN(const Layout layout, layout_in.as_symmetric("the Megatron torch_dist layout"));
  Builder b;
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
