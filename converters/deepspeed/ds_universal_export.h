// A DeepSpeed universal checkpoint written from any checkpoint ckpt reads (its weights under their
// canonical = HF names, which are the module's named_parameters() names of a transformers model
// wrapped by deepspeed.initialize), the layout ds_to_universal.py writes and DeepSpeed's
// load_checkpoint(load_dir) with `"checkpoint": {"load_universal": true}` resumes from at any ZeRO
// stage (1, 2, 3) and data-parallel world size (DeepSpeed 0.19.8's loaders:
// deepspeed/checkpoint/universal_checkpoint.py load_hp_checkpoint_state, runtime/base_optimizer.py
// load_hp_checkpoint_state_from_checkpoint_dir, runtime/zero/stage3.py
// load_hp_checkpoint_state_from_checkpoint_dir_stage3, runtime/engine.py _load_checkpoint):
//   <out>/latest_universal                         "global_step<N>"
//   <out>/global_step<N>/mp_rank_00_model_states.pt                 (what stages 1/2 open)
//   <out>/global_step<N>/zero_pp_rank_0_mp_rank_00_model_states.pt  (what stage 3 opens; same content)
//       {'module': OrderedDict() (universal loads skip it), 'buffer_names': [], 'optimizer': None,
//        'param_shapes': [OrderedDict(name: torch.Size)], 'frozen_param_shapes': OrderedDict(),
//        'shared_params': {}, 'frozen_param_fragments': OrderedDict(), 'lr_scheduler': None,
//        'data_sampler': None, 'random_ltd': None, 'skipped_steps': 0, 'global_steps': G,
//        'global_samples': 0, 'dp_world_size': 1, 'mp_world_size': 1,
//        'checkpoint_parallel_dimensions': {'pp_degree': 1, 'tp_degree': 1}, 'ds_version': V}
//   <out>/global_step<N>/zero/optimizer_state.pt
//       {'ds_version': V, 'param_groups': [G0] * 8,
//        'optimizer_state_dict': {'state': {0: {'step': S}}, 'param_groups': [G0]}}
//       G0 = {'lr', 'betas': (b1, b2), 'eps', 'params': [0]} from the source (those it records);
//       weight_decay is left to the loading engine's own groups (decay / no-decay); eight copies
//       because stages 1/2 zip the engine's groups with these (one copy would leave a second
//       group, the HF Trainer's no-decay one, unloaded). Loss scaler and clip_grad: the engine's.
//   <out>/global_step<N>/zero/<name>/fp32.pt, exp_avg.pt, exp_avg_sq.pt   {'cat_dim': 0, 'param': F32}
//   <out>/global_step<N>/zero/<name>/step.pt   S
// fp32 is optimizer.fp32_param.<name> when the source holds it, else the weight cast to F32; the
// moments optimizer.exp_avg.<name> / optimizer.exp_avg_sq.<name>. S is the Adam step: a float32
// 0-d tensor as torch's Adam/AdamW keep it, or a Python int (`int_step`) as DeepSpeed's FusedAdam
// and DeepSpeedCPUAdam do. N = G: the source's DeepSpeed global_steps, else the Adam step.
// Tensor bytes stream through the reshard Executor (bounded chunks, ds_universal_sink.h); the
// directory is built as <out>.partial and renamed when complete.
// Named errors: DeepSpeedNoOptimizerState (no Adam state and not `weights_only`), DeepSpeedPartial-
// OptimizerState (some parameters without both moments), DeepSpeedNoStep (moments but no recorded
// step and none given), DeepSpeedNotFloat (a weight of a non-float dtype), ShapeMismatch (a moment
// or master not of its weight's shape).
// Thread safety: reentrant.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "converters/hf/hf_export.h"
#include "formats/tensor/tensor_io.h"

namespace ckpt {

struct DsUniversalOptions {
  // SRC without Adam state (an HF model): write zero moments and step 0, which is exactly the state
  // a new Adam/AdamW starts from, instead of refusing (DeepSpeedNoOptimizerState).
  bool weights_only = false;
  bool int_step = false;               // step as a Python int (FusedAdam, DeepSpeedCPUAdam) instead of a tensor
  std::optional<int64_t> step;         // the Adam step to write (default: the source's)
  std::string ds_version = "0.19.8";   // ds_version written (a DeepSpeed source's own when it has one)
  int threads = 2;
  uint64_t max_chunk_bytes = 64ull << 20;
  bool fsync = true;
  IoMode io = IoMode::kAuto;
  std::function<void(uint64_t, uint64_t)> progress;
  std::function<Status()> before_commit;  // after every tensor byte is written, before the rename
};

struct DsUniversalPlan {
  std::vector<std::string> params;  // parameter names, in source order
  std::vector<Shape> shapes;
  HfExportPlan copy;                // the source tensors copied (F32), one piece per universal file
  std::vector<std::string> files;   // per copy piece: "<name>/<state>.pt" under zero/
  bool fresh_adam = false;          // weights_only: moments written as zeros
  int64_t step = 0, global_steps = 0;
  nlohmann::json adam = nlohmann::json::object();  // lr, beta1, beta2, eps (those known)
  std::string ds_version, tag;
};

// The Adam step and hyper-parameters a checkpoint's metadata records: {"step", "lr", "beta1",
// "beta2", "eps", "weight_decay", "global_steps"} (DeepSpeed: deepspeed.optimizer_step /
// global_steps and adam; Megatron and ckpt's trainer: megatron_optimizer_fields).
nlohmann::json ds_universal_optimizer_fields(const nlohmann::json& meta);

Result<DsUniversalPlan> plan_ds_universal(const TensorSource& src, const DsUniversalOptions& o);

// Writes `out` (a new directory; nothing is left there on failure).
Status run_ds_universal(TensorSource& src, const DsUniversalPlan& plan, const std::string& out, const DsUniversalOptions& o);

}  // namespace ckpt
