// Trainer checkpoints in the native store: fp32 weights (the master weights of an fp32 run) under
// their HF names, Adam moments as optimizer.exp_avg.<name> / optimizer.exp_avg_sq.<name>, and
// metadata model_config (HF config.json), layout (reshard Layout JSON), trainer (step, LR
// schedule, data cursor, seed, optimizer hyper-parameters, batch shape).
// A Snapshot is the staging copy taken from the live model so a background thread can write it
// while training continues; its buffers are reused from one save to the next.
// Thread safety: take_snapshot on the training thread; write_snapshot may run on any one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/status.h"
#include "formats/store/store_writer.h"
#include "formats/tensor_io.h"
#include "trainer/adamw.h"
#include "trainer/model.h"
#include "trainer/lr_schedule.h"

namespace ckpt::trainer {

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
  static Result<TrainerState> from_json(const nlohmann::json& j);
};

struct Snapshot {
  std::vector<TensorMeta> tensors;
  std::vector<Piece> pieces;           // one whole-tensor F32 piece per tensor, same order
  std::vector<std::vector<float>> data;  // [numel of tensor i] staging copies
  nlohmann::json metadata;
  int64_t step = 0;
  uint64_t bytes = 0;
};

// Copies weights and moments of `model` / `opt` into `snap` (buffers reused when shapes match).
void take_snapshot(Model<float>& model, const AdamW& opt, const TrainerState& state, Snapshot* snap);

// Writes `snap` to `<run_dir>/step-XXXXXXXX` through StoreWriter (temp dir + rename) and then
// points `<run_dir>/latest` at it.
Status write_snapshot(const Snapshot& snap, const std::string& run_dir,
                      const store::StoreOptions& opts = {});

// Loads a checkpoint (a checkpoint dir, or a run dir whose `latest` is followed) into `model`
// and `opt` (whose slots must already exist, one per parameter) and returns its trainer state.
// Checks that the stored model_config matches the model's, and every tensor's shape. Reads go
// through the engine's read_global_box (coverage checked); `progress(bytes done, total)` is
// called after each tensor.
Result<TrainerState> load_checkpoint(const std::string& path, Model<float>& model, AdamW& opt,
                                     const std::function<void(uint64_t, uint64_t)>& progress = nullptr);

}  // namespace ckpt::trainer
