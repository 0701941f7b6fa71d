// Reading a Megatron-LM per-rank directory (mp_rank_XX[_YYY]/model.safetensors + megatron_args.json,
// as export_megatron writes it) back in canonical global view: the mirror of MegatronSink. Every
// segment of the segment map (converters/megatron/megatron_segments.h) is a piece of its canonical tensor,
// so the engine unpacks QKV and [gate; up] by box intersection. A source is used by one thread
// at a time.
#pragma once

#include <memory>
#include <string>

#include "formats/tensor/tensor_io.h"

namespace ckpt {

// True when `dir` is a directory holding megatron_args.json (a layout written by export_megatron).
bool is_megatron_dir(const std::string& dir);

// Opens such a directory as a TensorSource in canonical global view (HF names and shapes): the
// config and layout come from megatron_args.json (bounded, type-checked), the norm naming is
// detected, and every rank file is checked before use (present, every expected tensor with its
// exact shape, one dtype per canonical tensor). Pieces are the segments of the Megatron tensors;
// vocab padding rows are skipped. Metadata: model_config, layout, megatron_args.
Result<std::unique_ptr<TensorSource>> open_megatron_dir(const std::string& dir);

}  // namespace ckpt
