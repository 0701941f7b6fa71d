// The canonical (HF) view of a set of Megatron-LM per-rank tensor files, whatever their file
// format: each rank's tensors in mcore naming (decoder.layers.N..., layer index local to its
// pipeline stage), one whole piece per tensor, are matched against the segment map
// (converters/megatron/megatron_segments.h) and every segment becomes a piece of its canonical tensor, so
// the engine unpacks QKV and [gate; up] by box intersection and the vocab padding rows are never
// read. Used by MegatronDirSource (per-rank safetensors, megatron_args.json) and by the legacy
// torch source (per-rank model_optim_rng.pt, pickled args). A source is used by one thread at a
// time.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "converters/megatron/megatron_segments.h"
#include "converters/model/llama_config.h"
#include "formats/tensor/tensor_io.h"
#include "reshard/layout/layout.h"

namespace ckpt {

// What the Megatron args say: the model config (biases not yet known: they are read off the rank
// files) and the layout, plus the args themselves (kept in the metadata as megatron_args).
struct MegatronArgs {
  nlohmann::json json;
  LlamaConfig config;
  Layout layout;
};

// Reads the args (Megatron-LM's names: tensor_model_parallel_size, pipeline_model_parallel_size,
// num_layers, hidden_size, ffn_hidden_size, num_attention_heads, num_query_groups, kv_channels,
// vocab_size, make_vocab_size_divisible_by, untie_embeddings_and_output_weights, swiglu,
// norm_epsilon, rotary_base, max_position_embeddings, and ckpt's layers_per_stage), bounded and
// type-checked; errors are BadMegatronArgs naming `args_file` and the key.
Result<MegatronArgs> megatron_args_from_json(nlohmann::json j, const std::string& args_file);

// The rank files, index pp_rank * tp + tp_rank: a TensorSource per rank holding its tensors in
// mcore naming, one whole piece each; `paths` names each file in errors.
// `integrity`: what the set can check, by format name (the source's integrity()); check() and
// check_piece() forward to the files (each file's own units: zip entries, or every byte read).
// `parts` (MoE with expert parallelism): which rank and part each file holds, one per file; empty:
// file pp_rank * tp + tp_rank holds the whole of that rank.
struct MegatronFilePart {
  int tp_rank = 0;
  int pp_rank = 0;
  MegatronRankPart part;
};
struct MegatronRankFiles {
  std::vector<std::unique_ptr<TensorSource>> files;
  std::vector<std::string> paths;
  IntegrityInfo integrity;
  std::vector<MegatronFilePart> parts;
};

// The canonical view: every rank file checked against the segment map (every expected tensor
// present with its exact shape, one dtype per canonical tensor); norm naming (TE or local) and
// biases detected from rank (0, 0). Metadata: model_config, layout, megatron_args, plus the
// entries of `extra_meta` (a null entry removes the key: a virtual pipeline's source passes its
// plain pipeline of chunks as `args.layout` and "layout": null).
Result<std::unique_ptr<TensorSource>> open_megatron_ranks(std::string describe, MegatronArgs args,
                                                          MegatronRankFiles ranks,
                                                          nlohmann::json extra_meta = nlohmann::json::object());

}  // namespace ckpt
