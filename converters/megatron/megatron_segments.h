// The Megatron-LM segment map: each per-rank tensor of Megatron-LM (mcore GPT, LLaMA settings) as
// the concatenation along dim 0 of boxes of canonical HF tensors, and zero segments for vocab
// padding. Packing rules (docs/RESHARD.md): linear_qkv holds [q heads of g; k_g; v_g] for each
// query group g of the rank, linear_fc1 holds [gate_r; up_r], linear_proj and linear_fc2 are
// row-parallel, embedding and output head are vocab-parallel with the vocabulary padded.
// The export (MegatronSink) writes through this map and MegatronDirSource reads back through it.
// Pure functions of (config, layout, ranks); thread safe.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "converters/model/llama_config.h"
#include "formats/tensor/tensor_io.h"
#include "reshard/layout/layout.h"

namespace ckpt {

// One slab of a Megatron tensor: `box` of canonical tensor `tensor`, or, when `tensor` is empty,
// `zero_rows` rows of zeros (vocab padding) with the Megatron tensor's trailing dims.
struct MegatronSegment {
  std::string tensor;    // canonical (HF) name; empty = zero padding
  Box box;               // region of the canonical tensor (unused for zero padding)
  int64_t zero_rows = 0;
  // Flat: the segment fills box.numel() elements of a 1-D Megatron tensor (the distributed
  // optimizer's bucket buffers, converters/megatron/dist_optim_group.h), in the box's row-major order.
  bool flat = false;
  // Expert: `box` is [1, rows, cols] of a stacked expert tensor ([E, F, h] / [E, h, F]) and the
  // Megatron tensor is 2-D: the leading expert dim (extent 1) is not in it.
  bool expert = false;
  int64_t rows() const {
    return tensor.empty() ? zero_rows : flat ? box.numel() : expert ? box.extent[1] : (box.ndim() ? box.extent[0] : 1);
  }
};

struct MegatronTensor {
  std::string name;  // e.g. "decoder.layers.0.self_attention.linear_qkv.weight"
  Shape shape;       // dim 0 = sum of the segments' rows; trailing dims = every segment's
  std::vector<MegatronSegment> segments;
};

enum class MegatronNormNames {
  kTransformerEngine,  // self_attention.linear_qkv.layer_norm_weight, mlp.linear_fc1.layer_norm_weight
  kLocal,              // input_layernorm.weight, pre_mlp_layernorm.weight
};

// Which part of an MoE model's rank a file holds (Megatron-LM's legacy files of an expert parallel
// run: mp_rank_TT[_PPP]_EEE holds the dense tensors of TP rank TT and the experts of EP rank EEE;
// the expert TP rank is the stage-local rank modulo etp). `dense`: attention, norms, routers,
// shared experts, embeddings; `experts`: mlp.experts.local_experts.{j}.linear_fc1/fc2 of the
// experts [ep_rank * E/ep, (ep_rank+1) * E/ep), rows / columns of the etp_rank-th part of F.
struct MegatronRankPart {
  int ep_rank = 0;
  int etp_rank = 0;
  bool dense = true;
  bool experts = true;
  // TEGroupedMLP's legacy names: mlp.experts.linear_fc1.weight{j} / linear_fc2.weight{j} instead of
  // SequentialMLP's mlp.experts.local_experts.{j}.linear_fc1.weight (same shapes, j local).
  bool te_grouped = false;
};

// The Megatron tensors of rank (tp_rank, pp_rank) in legacy per-rank naming (layer index
// restarting at 0 in each stage), in a fixed order. An MoE layer (docs/MOE.md, Megatron-Core
// naming) has mlp.router.weight (+ expert_bias), the local experts of `part` and the shared expert
// (linear_fc1 [gate; up] and linear_fc2 split over tp, gate_weight), its norm pre_mlp_layernorm. Refuses (kUnsupported / kInvalidArgument)
// layouts Megatron cannot express: tp not dividing num_key_value_heads (Megatron requires
// num_query_groups % tp == 0), heads or intermediate not divisible, pp/layer mismatch.
Result<std::vector<MegatronTensor>> megatron_rank_tensors(
    const LlamaConfig& config, const Layout& layout, int tp_rank, int pp_rank,
    MegatronNormNames norms = MegatronNormNames::kTransformerEngine, const MegatronRankPart& part = {});

// Megatron `args` of this export: tensor/pipeline sizes, num_layers, hidden_size,
// num_attention_heads, num_query_groups, kv_channels, ffn_hidden_size, padded_vocab_size,
// swiglu, untie_embeddings_and_output_weights, layers_per_stage, ...
nlohmann::json megatron_args(const LlamaConfig& config, const Layout& layout);

// "mp_rank_01" when pp == 1, else "mp_rank_01_002"; with ep > 1 the EP rank appended
// ("mp_rank_01_003", "mp_rank_01_002_003"), as Megatron-LM's get_checkpoint_name.
std::string megatron_rank_dir(const Layout& layout, int tp_rank, int pp_rank, int ep_rank = 0);

}  // namespace ckpt
