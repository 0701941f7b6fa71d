// What one rank of the trainer holds in memory, as regions of the checkpoint's global tensors:
// the link between the parallel trainer (which owns the buffers) and its checkpoints (which save
// and restore them through the engine, whatever the layout on either side).
// trainer_tensors(): the global tensors of a trainer checkpoint, in their canonical order (the
// model's parameters as llama_model_tensors lists them, then optimizer.exp_avg.<param> for each,
// then optimizer.exp_avg_sq.<param>), all F32. The ZeRO-1 flat layout (reshard/planner.h) follows
// this order, so every trainer checkpoint and every trainer rank agree on it.
// Plain values; thread safe.
#pragma once

#include <string>
#include <vector>

#include "converters/model/llama_config.h"
#include "formats/tensor/region.h"
#include "formats/tensor/tensor_io.h"

namespace ckpt::trainer {

inline constexpr const char* kExpAvgPrefix = "optimizer.exp_avg.";
inline constexpr const char* kExpAvgSqPrefix = "optimizer.exp_avg_sq.";

struct HeldRegion {
  std::string tensor;   // global tensor name (trainer_tensors)
  Region region;        // the elements held (a TP box, or a flat range of one under ZeRO-1)
  float* data = nullptr;  // region.numel() values in storage order, owned by the trainer
};

std::vector<TensorMeta> trainer_tensors(const LlamaConfig& c);

}  // namespace ckpt::trainer
