// Which training stack's memory the planner assumes (docs/PLAN.md "Memory models"):
// - megatron: the cost model's formula for a real-precision training (weights and gradients in
//   the device type's dtype, fp32 Adam state, activations of the micro-batches in flight; no
//   process constant): what Megatron-style stacks on the cluster's devices allocate;
// - embedded: what `ckpt train` (the reference trainer) allocates, by the trainer's own estimate
//   (trainer/memory_estimate.h: fp32 everything, workspace, buffers, checkpoint staging, the
//   process constant): a plan for `ckpt train --layout L --cluster C` passes its memory check.
// Not thread safe (EmbeddedStageMemory memoizes); one per search or evaluation.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>

#include "converters/model/llama_config.h"
#include "formats/base/status.h"

namespace ckpt::trainer {

enum class MemoryModel { kMegatron, kEmbedded };

// "megatron" | "embedded".
std::string memory_model_name(MemoryModel m);
// Errors: BadPlan naming the accepted names.
Result<MemoryModel> parse_memory_model(const std::string& name);

// A stage rank's memory by the embedded trainer's estimate (estimate_stage_memory), memoized by
// the stage's shape. Bytes: weights, grads, optimizer, activations, and `other` (workspace,
// buffers, checkpoint staging, process constant). An estimate that fails (a stage the model
// cannot have) is UINT64_MAX in `other`: it never fits.
struct StageMemoryBytes {
  uint64_t weights = 0, grads = 0, optimizer = 0, activations = 0, other = 0;
};

class EmbeddedStageMemory {
 public:
  // world_size: the ranks of the layouts weighed (the process constant grows with it under MPI).
  EmbeddedStageMemory(const LlamaConfig& config, int world_size) : config_(config), world_(world_size) {}
  // ep / etp: the stage's expert parallelism (1 / tp: none).
  StageMemoryBytes get(int layers, int tp, bool first, bool last, int64_t micro_batch, int64_t seq_len, int64_t slots, int zero_ways,
                       int pipelines, int ep = 1, int etp = 0);

 private:
  LlamaConfig config_;
  int world_ = 1;
  std::map<std::tuple<int, int, bool, bool, int64_t, int64_t, int64_t, int, int, int, int>, StageMemoryBytes> memo_;
};

}  // namespace ckpt::trainer
