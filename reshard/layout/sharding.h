// ShardingRules: the model knowledge the generic engine asks for. For a global tensor under a
// layout it says which pipeline stages hold it and which box each TP rank holds; the engine
// (planner) derives every rank's pieces from that, ZeRO-1 flat shards included.
// Implementations live in converters/ (e.g. converters/model/llama_sharding.h). Thread safe (const).
#pragma once

#include <vector>

#include "formats/base/status.h"
#include "formats/tensor/region.h"
#include "formats/tensor/tensor_io.h"
#include "reshard/layout/layout.h"

namespace ckpt {

struct TensorPlacement {
  std::vector<int> stages;     // pipeline stages holding the tensor (tied embedding: first and last)
  std::vector<Box> tp_boxes;   // size layout.tp: the box of the global tensor each TP rank holds
                               // (replicated: the whole box for every rank; vocab-parallel: rows
                               // of the padded split clipped to the real vocab, possibly empty;
                               // KV heads replicated when tp > K: several ranks share one box)
  bool optimizer_state = false;  // an optimizer tensor: flat-sharded over DP when layout.zero == 1
  // An expert tensor under an expert-parallel layout (Layout::expert_parallel): its boxes differ
  // between the DP ranks of a stage, and ZeRO-1 flat-shards it over the ranks holding the same box
  // (the expert data-parallel group) instead of over DP (reshard/layout/zero_layout.h).
  bool expert = false;
};

class ShardingRules {
 public:
  virtual ~ShardingRules() = default;
  // Refuses layouts the model cannot take (tp not dividing heads, more stages than layers,
  // layer count mismatch, ...) with a clear message, before anything is written.
  virtual Status check_layout(const Layout& layout) const = 0;
  virtual Result<TensorPlacement> place(const TensorMeta& tensor, const Layout& layout) const = 0;
};

}  // namespace ckpt
