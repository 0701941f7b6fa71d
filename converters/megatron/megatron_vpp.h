// Megatron's virtual (interleaved) pipeline: the layers of each model chunk. With pipeline size pp
// and v virtual stages, every pipeline rank p holds v chunks; chunk c of rank p holds the
//   n = num_layers / (pp * v)
// consecutive layers starting at c * (num_layers / v) + p * n (megatron/core/transformer/
// transformer_layer.py get_transformer_layer_offset), layer indices restarting at 0 in each chunk.
// The forward runs chunk 0 of every stage, then chunk 1, ...: chunk c of rank p is the
// s = c * pp + p-th "virtual stage" of a plain pipeline of pp * v stages, each of n layers, the
// embedding in virtual stage 0 (chunk 0 of rank 0), the final norm and output layer in virtual stage
// pp * v - 1 (the last chunk of the last rank). The per-rank readers and writers use that plain
// pipeline (megatron_vpp_layout) and map its stage s back to (rank, chunk) and the other way.
// Uneven interleaving (--num-layers-in-first/last-pipeline-stage with a virtual pipeline,
// --pipeline-model-parallel-layout) is not handled. Pure functions; thread safe.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "formats/base/status.h"
#include "reshard/layout/layout.h"

namespace ckpt {

struct VppChunk {
  int pp_rank = 0;
  int chunk = 0;
  int64_t first_layer = 0;  // global index of the chunk's layer 0
  int64_t num_layers = 0;
};

// Layers per chunk: num_layers / (pp * vpp). MegatronVppLayersNotDivisible when pp * vpp does not
// divide num_layers (`what` names the checkpoint or flag); kInvalidArgument for sizes < 1.
Result<int64_t> megatron_vpp_chunk_layers(int64_t num_layers, int pp, int vpp, const std::string& what);

// Chunk `chunk` of pipeline rank `pp_rank` (both in range, else kInvalidArgument).
Result<VppChunk> megatron_vpp_chunk(int64_t num_layers, int pp, int vpp, int pp_rank, int chunk,
                                    const std::string& what);

// The plain pipeline's stage of chunk `chunk` of rank `pp_rank`: chunk * pp + pp_rank, and back.
inline int megatron_vpp_virtual_stage(int pp, int pp_rank, int chunk) { return chunk * pp + pp_rank; }
inline VppChunk megatron_vpp_of_stage(int pp, int stage) { return VppChunk{stage % pp, stage / pp, 0, 0}; }

// The plain pipeline of pp * vpp even stages (tp, vocab divisor of `layout` kept; layout.pp = the
// real pipeline size; its stage split must be even, else MegatronVppLayersNotDivisible; vpp > 1
// needs pp > 1, else MegatronVppNeedsPipeline, as Megatron-LM's arguments.py asserts).
Result<Layout> megatron_vpp_layout(const Layout& layout, int vpp, const std::string& what);

// Megatron `args` (megatron_segments.h megatron_args of the real layout) for a virtual pipeline
// of `vpp` chunks per stage: virtual_pipeline_model_parallel_size, num_layers_per_virtual_pipeline_
// stage, and no layers_per_stage (an interleaved pipeline is split evenly; Megatron-LM's
// decoder_first/last_pipeline_num_layers stay unset). `args` unchanged when vpp == 1.
nlohmann::json megatron_vpp_args(nlohmann::json args, int vpp);

}  // namespace ckpt
