#include "trainer/optim/held_region.h"

namespace ckpt::trainer {

std::vector<TensorMeta> trainer_tensors(const LlamaConfig& c) {
  std::vector<TensorMeta> params = llama_model_tensors(c, DType::kF32);
  std::vector<TensorMeta> out = params;
  for (const char* prefix : {kExpAvgPrefix, kExpAvgSqPrefix})
    for (const TensorMeta& t : params) out.push_back({prefix + t.name, DType::kF32, t.shape});
  return out;
}

}  // namespace ckpt::trainer
