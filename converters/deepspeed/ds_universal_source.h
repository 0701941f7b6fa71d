// Reading a DeepSpeed universal checkpoint (what deepspeed/checkpoint/ds_to_universal.py writes, and
// `ckpt export-deepspeed`: ds_universal_export.h) as a TensorSource in HF names:
//   <dir>/latest_universal                 the tag (or <dir> is the step directory itself)
//   <tag>/mp_rank_00_model_states.pt or zero_pp_rank_0_mp_rank_00_model_states.pt: param_shapes
//   <tag>/zero/<param>/fp32.pt, exp_avg.pt, exp_avg_sq.pt   {'param': tensor, 'cat_dim', ...} or a
//                                          bare tensor (stage 3; flat, shaped by param_shapes)
//   <tag>/zero/<param>/step.pt             the Adam step (int, float or 0-d tensor; optional)
//   <tag>/zero/optimizer_state.pt          param_groups (lr, betas, eps, weight_decay), and for stage 3
//                                          optimizer_state_dict.state[0].step
// Tensors: every parameter of param_shapes as its fp32 master, and optimizer.exp_avg.<name> /
// optimizer.exp_avg_sq.<name> when every parameter has both moments. Metadata: adam, deepspeed
// {detected, kind "universal", tag, step_dir, ds_version, global_steps, optimizer_step},
// model_config (config.json beside latest_universal, in the step dir or its parent).
// Files are opened when read (at most a few at a time: a universal checkpoint has 3 per parameter),
// through the restricted unpickler. Named errors (with the file): DeepSpeedUniversal (a missing
// zero/<param>/fp32.pt or model states file, a tensor not of its parameter's size or not dense,
// moments for some parameters only, a malformed file), DeepSpeedLatest (latest_universal), and
// those of param_shapes (deepspeed_files.h).
// Thread safety: read() and check_piece() may be called from several threads (one lock per source).
#pragma once

#include <memory>
#include <string>

#include "formats/tensor/tensor_io.h"

namespace ckpt {

// True when `path` holds zero/optimizer_state.pt beside a model states file, or a latest_universal
// file (file names only; a tag naming no such directory is DeepSpeedLatest at open).
bool is_deepspeed_universal_dir(const std::string& path);

Result<std::unique_ptr<TensorSource>> open_deepspeed_universal(const std::string& path);

}  // namespace ckpt
