// Trainer checkpoints in the native store: fp32 weights (the master weights of an fp32 run) under
// their HF names, Adam moments as optimizer.exp_avg.<name> / optimizer.exp_avg_sq.<name>
// (trainer/optim/held_region.h), and metadata model_config (HF config.json), layout (reshard Layout
// JSON), trainer (this file's TrainerState: step, LR schedule, data cursor, seed, optimizer
// hyper-parameters, batch shape). Saved and loaded by trainer/state/dist_checkpoint.h on any layout.
// Plain values; thread safe.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/base/status.h"
#include "formats/store/store_writer.h"
#include "formats/tensor/tensor_io.h"
#include "trainer/model/model.h"
#include "trainer/optim/adamw.h"
#include "trainer/optim/lr_schedule.h"

namespace ckpt::trainer {

// Bounds of the batch shape a checkpoint (or the command line) may give: far above any run the
// reference trainer can hold, they keep a corrupted value from sizing buffers (tokens per step are
// bounded again by the layout, train_loop.cc check_batch).
inline constexpr int64_t kMaxMicroBatch = int64_t{1} << 20;
inline constexpr int64_t kMaxGradAccum = int64_t{1} << 20;
inline constexpr int64_t kMaxSeqLen = int64_t{1} << 24;
inline constexpr int64_t kMaxGlobalBatch = int64_t{1} << 31;

// The `trainer` metadata object.
struct TrainerState {
  int64_t step = 0;             // optimizer steps done (= Adam step count)
  LrSchedule schedule;
  uint64_t seed = 0;            // init and data seed
  std::string data_source = "procedural";
  int64_t micro_batch = 1, seq_len = 1, grad_accum = 1;  // micro_batch: of DP rank 0 (per-rank
                                // sizes are in the layout); grad_accum: micro-batches per DP rank per step
  int64_t global_batch = 1;     // samples per step (data.samples_per_step), whatever the layout
  AdamWOptions adam;
  double max_grad_norm = 1.0;

  // data cursor: the next step's samples are (seed, step, 0 .. micro_batch*grad_accum-1).
  nlohmann::json to_json() const;
  // Reads and range-checks every field (out_of_range, LrSchedule and AdamW ranges, data.next_step
  // == step): "BadTrainerState" for a missing field or a wrong type, "TrainerStateOutOfRange"
  // naming the field, its value and its range. The caller adds the checkpoint's path.
  static Result<TrainerState> from_json(const nlohmann::json& j);
  // The first field out of its range, as "<prefix>adamw.beta1 = 2 (expected in [0, 1))", or "".
  std::string out_of_range(const std::string& prefix) const;
};

}  // namespace ckpt::trainer
