// The layout `ckpt train` runs on, from its flags or a layout file (either form of
// reshard/layout/layout.h: symmetric tp/pp/dp, or pipelines of stages with per-stage tp, FlagScale or
// FlashFlex style), checked before any work: structure (Layout::validate: every stage non-empty,
// one micro-batch size per pipeline), the model on every stage (check_layout_views: each stage's
// tp dividing heads, KV heads and intermediate_size; errors name the pipeline and stage), the
// trainer's own limit (each stage's tp must divide the KV heads: no KV replication), and the
// world size (mpirun -np must equal layout.world_size()). Pure functions; thread safe.
#pragma once

#include <string>
#include <vector>

#include "converters/model/llama_config.h"
#include "formats/base/status.h"
#include "reshard/layout/layout.h"
#include "reshard/layout/layout_values.h"

namespace ckpt::trainer {

struct TrainLayoutFlags {
  LayoutValues values;              // --tp --pp --pp-layers --dp --zero (none given: one process)
  std::string file;                 // --layout FILE (excludes the flags above)
  std::vector<int> micro_batches;   // --micro-batches a,b,..: per pipeline (DP rank); empty: the
                                    // layout file's sizes, else micro_batch each
  int64_t micro_batch = 1;          // --micro-batch: every pipeline's size when neither gives one
};

// The layout for `config`, or an error naming the flag or file and the problem. `world_size` is
// the number of processes started (Comm::world().size()).
Result<Layout> train_layout(const TrainLayoutFlags& f, const LlamaConfig& config, int world_size);

// Samples per step of a layout: grad_accum * the sum of the pipelines' micro-batch sizes.
int64_t global_batch(const Layout& layout, int64_t grad_accum);

}  // namespace ckpt::trainer
