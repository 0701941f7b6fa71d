// Megatron-LM (mcore GPT, LLaMA settings) per-rank tensors described as ordered lists of segments
// of canonical HF tensors: each Megatron tensor is the concatenation along dim 0 of boxes of
// canonical tensors (and zero segments for vocab padding). Packing rules: docs/RESHARD.md.
// The same segment map writes the layout (export_megatron) and reads it back (open_megatron_dir:
// every segment is a piece of its canonical tensor, so the engine unpacks QKV and [gate; up]).
// Pure functions of (config, layout, ranks) are thread safe; a MegatronDirSource is used by one
// thread at a time.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "converters/llama_config.h"
#include "formats/tensor_io.h"
#include "reshard/layout.h"

namespace ckpt {

// One slab of a Megatron tensor: `box` of canonical tensor `tensor`, or, when `tensor` is empty,
// `zero_rows` rows of zeros (vocab padding) with the Megatron tensor's trailing dims.
struct MegatronSegment {
  std::string tensor;    // canonical (HF) name; empty = zero padding
  Box box;               // region of the canonical tensor (unused for zero padding)
  int64_t zero_rows = 0;
  int64_t rows() const { return tensor.empty() ? zero_rows : (box.ndim() ? box.extent[0] : 1); }
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

// The Megatron tensors of rank (tp_rank, pp_rank) in legacy per-rank naming (layer index
// restarting at 0 in each stage), in a fixed order. Refuses (kUnsupported / kInvalidArgument)
// layouts Megatron cannot express: tp not dividing num_key_value_heads (Megatron requires
// num_query_groups % tp == 0), heads or intermediate not divisible, pp/layer mismatch.
Result<std::vector<MegatronTensor>> megatron_rank_tensors(
    const LlamaConfig& config, const Layout& layout, int tp_rank, int pp_rank,
    MegatronNormNames norms = MegatronNormNames::kTransformerEngine);

// Megatron `args` of this export: tensor/pipeline sizes, num_layers, hidden_size,
// num_attention_heads, num_query_groups, kv_channels, ffn_hidden_size, padded_vocab_size,
// swiglu, untie_embeddings_and_output_weights, layers_per_stage, ...
nlohmann::json megatron_args(const LlamaConfig& config, const Layout& layout);

// "mp_rank_01" when pp == 1, else "mp_rank_01_002".
std::string megatron_rank_dir(const Layout& layout, int tp_rank, int pp_rank);

struct MegatronExportOptions {
  int tp = 1, pp = 1;
  std::vector<int> layers_per_stage;  // empty: even split, earlier stages take the remainder
  int64_t vocab_divisor = 128;        // make-vocab-size-divisible-by
  std::optional<DType> dtype;         // output dtype; default: each canonical tensor's own
  MegatronNormNames norms = MegatronNormNames::kTransformerEngine;
  uint64_t chunk_bytes = 16ull << 20;  // read/write buffer size
};

// Writes `dst`/mp_rank_XX[_YYY]/model.safetensors for every rank plus `dst`/megatron_args.json,
// from the model tensors of `src` (global view; config from metadata "model_config"). Output goes
// to `dst`.partial, renamed to `dst` when complete; `dst` must not exist. Optimizer state is not
// exported. Every needed tensor is checked (present, shape) before anything is written.
Status export_megatron(TensorSource& src, const std::string& dst, const MegatronExportOptions& opts);

// True when `dir` is a directory holding megatron_args.json (a layout written by export_megatron).
bool is_megatron_dir(const std::string& dir);

// Opens such a directory as a TensorSource in canonical global view (HF names and shapes): the
// config and layout come from megatron_args.json (bounded, type-checked), the norm naming is
// detected, and every rank file is checked before use (present, every expected tensor with its
// exact shape, one dtype per canonical tensor). Pieces are the segments of the Megatron tensors;
// vocab padding rows are skipped. Metadata: model_config, layout, megatron_args.
Result<std::unique_ptr<TensorSource>> open_megatron_dir(const std::string& dir);

}  // namespace ckpt
