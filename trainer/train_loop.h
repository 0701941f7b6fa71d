// The single-process training loop of the reference trainer (`ckpt train`): model + AdamW +
// warm-up/cosine schedule + gradient accumulation + global-norm clipping, a line per step (and
// JSON lines in <run_dir>/train_log.jsonl), checkpoints every K steps and at the end
// (asynchronous by default), resume from a checkpoint or the run dir's `latest`.
// Thread safety: a Trainer is driven by one thread (plus its saver's background thread).
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "converters/model/llama_config.h"
#include "formats/base/status.h"
#include "formats/digest/digest.h"
#include "reshard/layout/layout.h"
#include "reshard/layout/layout_values.h"
#include "trainer/data.h"
#include "trainer/model/model.h"
#include "trainer/optim/adamw.h"
#include "trainer/optim/lr_schedule.h"
#include "trainer/state/trainer_state.h"

namespace ckpt::trainer {

struct TrainOptions {
  LlamaConfig config;
  int64_t steps = 200;          // train until this many optimizer steps are done
  int64_t total_steps = -1;     // LR schedule horizon (-1: = steps)
  int64_t save_every = 0;       // 0: save only at the end (when out_dir is set)
  std::string out_dir;          // run dir (checkpoints, train_log.jsonl); empty: no output
  std::string resume;           // "", "latest" (out_dir/latest), or a checkpoint / run dir
  std::string init;             // "" or a checkpoint whose model weights start the run (step 0, new
                                // optimizer state; e.g. `ckpt from-hf` of an HF model)
  uint64_t seed = 1234;
  double lr = 3e-3;             // peak LR
  int64_t warmup = 20;
  int64_t micro_batch = 8;
  int64_t seq_len = 64;
  int64_t grad_accum = 1;
  int threads = 1;              // OpenBLAS threads
  double max_grad_norm = 1.0;
  AdamWOptions adam;
  std::string data_path;        // corpus file; empty: procedural corpus
  // The layout (trainer/train_layout.h): flags or a file; none given: one process. micro_batch
  // above is every DP rank's size unless micro_batches lists one per DP rank.
  LayoutValues layout_values;
  std::string layout_file;
  std::vector<int> micro_batches;
  // Cluster file (reshard/dist/cluster.h): checked against the layout and every rank's memory estimate
  // (trainer/memory_report.h) before anything is allocated; empty: no check.
  std::string cluster_file;
  // --emulate (trainer/emulate.h): stretch every rank's compute to its cluster device type's
  // speed relative to the fastest; needs cluster_file.
  bool emulate = false;
  std::string dump_grads;       // directory: the first step's gradients (global view), as a checkpoint
  bool async_save = true;
  DigestAlgo digest = kDefaultDigest;  // of every checkpoint piece (--digest)
  bool print = true;            // a line per step on stdout
  // Progress of the --resume read (bytes done, total), called during Trainer::create() only.
  std::function<void(uint64_t, uint64_t)> resume_progress;
};

struct StepStats {
  int64_t step = 0;             // step count after this update (1-based)
  double loss = 0;              // mean token loss of the step (before the update)
  double lr = 0;
  double grad_norm = 0;         // before clipping
  double seconds = 0;           // wall time of the step (forward, backward, update)
  double tokens_per_s = 0;
  double flops_per_s = 0;       // model FLOP/s (Model::train_flops_per_token)
  double save_blocked_s = 0;    // time the loop was blocked by a checkpoint at this step
  double router_load = 0;       // MoE: max / mean tokens per expert of the most unbalanced layer (0: dense)
                                // (expert parallel: of the step's tokens on every rank)
  double a2a_s = 0;             // expert parallel: seconds in the MoE dispatch / combine collectives (in
                                // comm_s), the maximum over ranks; 0 otherwise
  // Parallel runs: the step's compute, communication (collectives) and pipeline-idle (waiting for
  // a neighbouring stage) seconds, each the maximum over ranks.
  double compute_s = 0, comm_s = 0, idle_s = 0;
  std::vector<double> rank_compute_s;  // parallel runs: every rank's own compute seconds
  // --emulate: Emulation::label() and the per-device-type factors ("" / null otherwise).
  std::string emulation;
  nlohmann::json emulation_factors;
};

// The trainer state at step 0 for options `o` (schedule, seed, batch shape, optimizer settings).
TrainerState initial_state(const TrainOptions& o);

// One AdamW slot per parameter of `model` (in canonical order), zeroed moments.
template <class T>
void add_param_slots(Model<T>& model, BasicAdamW<T>& opt);

// One optimizer step on the global batch of step state->step: grad_accum micro-batches of
// micro_batch sequences (samples (seed, step, 0 .. micro_batch*grad_accum-1)), mean token loss,
// global-norm clipping (torch clip_grad_norm_), AdamW at the schedule's LR; then state->step++.
// The training loop runs it in float; the exactness check against a float64 torch run
// (tests/tools/trainer_dump --f64) runs the same code in double.
// tokens, targets: scratch, resized to [micro_batch * seq_len].
template <class T>
Result<StepStats> optimizer_step(Model<T>& model, BasicAdamW<T>& opt, const TokenStream& data,
                                 TrainerState* state, std::vector<int32_t>* tokens,
                                 std::vector<int32_t>* targets);

// The parallel trainer: every rank of `mpirun -np N` (or the one process) builds its part of the
// model under the layout (trainer/train_layout.h), runs the 1F1B / DP / ZeRO-1 step
// (trainer/parallel_step.h), saves its own pieces in the background (trainer/state/dist_checkpoint.h)
// and resumes from a checkpoint of any layout. Rank 0 prints and logs.
class Trainer {
 public:
  // Validates options and the layout (before any work), builds and initializes this rank's
  // part of the model (or resumes it), opens the run dir. Collective over Comm::world().
  static Result<std::unique_ptr<Trainer>> create(const TrainOptions& o);
  ~Trainer();

  // One optimizer step (grad_accum micro-batches per DP rank). Collective.
  Result<StepStats> train_step();
  // Steps until options.steps, with logging and checkpoints; calls on_step after each step.
  Status run(const std::function<void(const StepStats&)>& on_step = nullptr);
  // Saves a checkpoint of the current state now (async or not per options); returns the time
  // the caller was blocked. Collective.
  Result<double> save(bool async);
  Status wait_saves();

  Model<float>& model() { return *model_; }
  const Layout& layout() const { return layout_; }
  const TrainerState& state() const { return state_; }
  int64_t step() const { return state_.step; }
  int rank() const;
  const TrainOptions& options() const { return opt_s_; }
  static std::string format_line(const StepStats& s);
  static nlohmann::json to_json(const StepStats& s);

  struct Parts;  // model groups, optimizer, saver (trainer/train_loop.cc)

 private:
  Trainer();
  Status resume(const std::string& path);
  Status init_weights(const std::string& path);  // --init

  TrainOptions opt_s_;
  Layout layout_;
  std::unique_ptr<Parts> parts_;
  std::unique_ptr<Model<float>> model_;
  TrainerState state_;
  TokenStream data_ = TokenStream::procedural(0);
  std::FILE* log_ = nullptr;  // rank 0
  bool grads_dumped_ = false;
};

}  // namespace ckpt::trainer
