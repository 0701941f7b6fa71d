// Re-plan on a cluster change (`ckpt plan --from CHECKPOINT --cluster NEW`): the model, global batch
// and sequence length of a trainer checkpoint (its metadata model_config, trainer, layout), for the
// search (trainer/plan/search.h); the reshard that moves it to the planned layout is
// converters/jobs/reshard_job.h's run_reshard_job. Pure except the manifest read.
#pragma once

#include <cstdint>
#include <string>

#include "converters/model/llama_config.h"
#include "formats/base/status.h"
#include "reshard/layout/layout.h"

namespace ckpt::trainer {

struct ReplanSource {
  std::string checkpoint;  // the checkpoint dir (a run dir's `latest` followed)
  LlamaConfig config;
  Layout layout;           // the checkpoint's layout
  int64_t global_batch = 0, seq_len = 0, step = 0;
};

// Errors: the store's (not a checkpoint), NoModelConfig when the metadata has no model_config,
// BadTrainerState without a trainer object (not a trainer checkpoint: give --model and
// --global-batch instead).
Result<ReplanSource> replan_source(const std::string& path);

}  // namespace ckpt::trainer
