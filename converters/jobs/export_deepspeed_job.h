// One `ckpt export-deepspeed` run below the CLI (cli/cmd_export_deepspeed.cc): the source opened
// (open_checkpoint: every kind ckpt reads) and checked by its format's own checks before the
// commit (converters/source/source_check_job.h), then written as a DeepSpeed universal checkpoint
// (converters/deepspeed/ds_universal_export.h) within --max-memory. On failure nothing is left at
// the destination. Thread safety: one job at a time per process (it may fork a verifier).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "converters/jobs/memory_fit.h"
#include "formats/base/status.h"

namespace ckpt {

struct ExportDeepSpeedRequest {
  std::string src, out;
  bool weights_only = false;          // --weights-only: no Adam state in SRC -> zero moments, step 0
  bool int_step = false;              // --int-step: the step as a Python int (FusedAdam, DeepSpeedCPUAdam)
  std::optional<int64_t> step;        // --step: the Adam step to write, 0..2^62
  int threads = 2;                    // 1..64
  uint64_t max_memory = kDefaultMaxMemory;
  IoMode io = IoMode::kAuto;
  bool fsync = true;
  bool no_verify = false;
  std::function<void(uint64_t, uint64_t)> progress;
};

struct ExportDeepSpeedOutcome {
  std::string out, tag;
  size_t params = 0, files = 0;
  uint64_t bytes = 0;
  int64_t step = 0;
  bool fresh_adam = false;
  nlohmann::json source_check;
  MemoryFit memory;
  // The JSON of `ckpt export-deepspeed --json`: {out, tag, params, files, bytes, step, fresh_adam, source_check, memory}.
  nlohmann::json to_json() const;
};

Result<ExportDeepSpeedOutcome> run_export_deepspeed_job(const ExportDeepSpeedRequest& req);

}  // namespace ckpt
