// The layout `ckpt train` runs on, from its flags or a layout file, checked before any work:
// structure (Layout::validate: every stage non-empty, micro-batch list of length dp), the model
// (LlamaShardingRules::check_layout: tp dividing heads, KV heads and intermediate_size), the
// trainer's own limit (tp must divide the KV heads: no KV replication), and the world size
// (mpirun -np must equal tp*pp*dp). Pure functions; thread safe.
#pragma once

#include <string>
#include <vector>

#include "converters/llama_config.h"
#include "converters/reshard_job.h"
#include "formats/status.h"
#include "reshard/layout.h"

namespace ckpt::trainer {

struct TrainLayoutFlags {
  LayoutValues values;              // --tp --pp --pp-layers --dp --zero (none given: one process)
  std::string file;                 // --layout FILE (excludes the flags above)
  std::vector<int> micro_batches;   // --micro-batches a,b,..: per DP rank (empty: micro_batch each)
  int64_t micro_batch = 1;          // --micro-batch: every DP rank's size when micro_batches is empty
};

// The layout for `config`, or an error naming the flag or file and the problem. `world_size` is
// the number of processes started (Comm::world().size()).
Result<Layout> train_layout(const TrainLayoutFlags& f, const LlamaConfig& config, int world_size);

// Samples per step of a layout: grad_accum * sum(layout.micro_batch).
int64_t global_batch(const Layout& layout, int64_t grad_accum);

}  // namespace ckpt::trainer
