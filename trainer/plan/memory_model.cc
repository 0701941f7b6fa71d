// Memory models of the planner (trainer/plan/memory_model.h).
#include "trainer/plan/memory_model.h"

#include <cstdint>

#include "trainer/memory_estimate.h"

namespace ckpt::trainer {

std::string memory_model_name(MemoryModel m) { return m == MemoryModel::kEmbedded ? "embedded" : "megatron"; }

Result<MemoryModel> parse_memory_model(const std::string& name) {
  if (name == "megatron") return MemoryModel::kMegatron;
  if (name == "embedded") return MemoryModel::kEmbedded;
  return Status::Error("BadPlan", "memory model '" + name +
                                      "': expected 'megatron' (a real-precision training stack) or 'embedded' (`ckpt train`, "
                                      "trainer/memory_estimate.h)");
}

StageMemoryBytes EmbeddedStageMemory::get(int layers, int tp, bool first, bool last, int64_t micro_batch, int64_t seq_len,
                                          int64_t slots, int zero_ways, int pipelines, int ep, int etp) {
  if (etp <= 0) etp = tp;
  const bool expert = ep > 1 || etp != tp;  // the replicas' count sizes the expert groups
  const auto key = std::make_tuple(layers, tp, first, last, micro_batch, seq_len, slots, zero_ways, expert ? pipelines : std::min(pipelines, 2),
                                   ep, etp);
  auto it = memo_.find(key);
  if (it != memo_.end()) return it->second;
  StageMemoryQuery q;
  q.layers = layers, q.tp = tp, q.first = first, q.last = last;
  q.micro_batch = micro_batch, q.seq_len = seq_len, q.slots = slots;
  q.zero_ways = zero_ways, q.pipelines = pipelines, q.world_size = world_;
  q.ep = ep, q.etp = etp;
  q.checkpoints = true;  // a run directory: the saver's staging counts
  q.mpi = world_ > 1;    // more than one rank runs under mpirun
  StageMemoryBytes b;
  auto m = estimate_stage_memory(config_, q);
  if (m.ok())
    b = {m->weights, m->grads, m->optimizer, m->activations, m->workspace + m->buffers + m->checkpoint + m->process};
  else
    b.other = UINT64_MAX;
  return memo_.emplace(key, b).first->second;
}

}  // namespace ckpt::trainer
