// The Megatron-Core `torch_dist` map: every sharded tensor of a megatron-core 0.16 GPTModel (LLaMA
// settings) as megatron.core.dist_checkpointing saves it, with each DCP chunk expressed as the
// concatenation of boxes of canonical (HF) tensors (the per-rank segment map of
// converters/megatron/megatron_segments.h, moved to global coordinates). What megatron-core writes
// (checked against its real output, tests/python/mcore_dist_fixtures.py):
//  - layers are stacked: decoder.layers.<X> has global shape [num_layers, <per-layer global
//    shape>] and one chunk per layer and TP rank; the layer index is global (stages add their
//    offset, uneven splits included);
//  - norms are named self_attention.linear_qkv.layer_norm_weight / mlp.linear_fc1.
//    layer_norm_weight (even with the local spec), replicated: one chunk per layer;
//  - linear_qkv: rows packed per query group over all groups, TP rank r's rows at r * rows/tp;
//  - linear_fc1: global [gate_all; up_all], rank r writes two chunks: gate rows at r * I/tp, up
//    rows at I + r * I/tp;
//  - linear_proj / linear_fc2: columns split (dim 2);
//  - embedding.word_embeddings / output_layer: [padded_vocab, hidden], rows split over TP;
//    decoder.final_layernorm.weight: one chunk.
// Optimizer keys: optimizer.state.<exp_avg|exp_avg_sq|fp32_param>.<model key>, same chunks.
// Pure functions; thread safe.
#pragma once

#include <string>
#include <vector>

#include "converters/megatron/megatron_segments.h"

namespace ckpt {

struct DistChunk {
  Box box;                                // in the global mcore tensor
  size_t row_dim = 0;                     // the dim along which the segments follow each other
  std::vector<MegatronSegment> segments;  // canonical boxes (or zero rows), in row order
  int rank = 0;                           // writing rank: pp_rank * tp + tp_rank
};

struct DistTensor {
  std::string key;  // sharded key, e.g. "decoder.layers.self_attention.linear_qkv.weight"
  Shape shape;      // global
  std::vector<DistChunk> chunks;
};

// The sharded tensors of a model saved with `layout` (symmetric; tp, pp and the stage split
// decide the chunking and ranks), in megatron-core's key order. Refusals as megatron_rank_tensors.
// An MoE model's layer norm is keyed by the spec: `norms` kLocal, the local spec's
// mlp.linear_fc1.layer_norm_weight (its key map); kTransformerEngine, TE's pre_mlp_layernorm.weight.
Result<std::vector<DistTensor>> megatron_dist_tensors(const LlamaConfig& config, const Layout& layout,
                                                      MegatronNormNames norms = MegatronNormNames::kLocal);

// The mcore box of segment `seg_index` of `chunk` (its rows along chunk.row_dim).
Box dist_segment_box(const DistChunk& chunk, size_t seg_index);

// Optimizer key prefixes of torch_dist and the canonical prefixes they map to ("" = the weight).
struct DistOptimizerPrefix {
  const char* dist;
  const char* canonical;
};
// The distributed optimizer's fp32 masters in its fully_reshardable form (megatron-core 0.17+).
inline constexpr const char* kDistMasterParamPrefix = "optimizer.state.param.";
inline constexpr DistOptimizerPrefix kDistOptimizerPrefixes[] = {
    {"optimizer.state.fp32_param.", ""},
    {"optimizer.state.exp_avg.", "optimizer.exp_avg."},
    {"optimizer.state.exp_avg_sq.", "optimizer.exp_avg_sq."},
};

}  // namespace ckpt
