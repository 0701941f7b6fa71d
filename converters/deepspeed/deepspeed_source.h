// Reading a DeepSpeed ZeRO checkpoint (stages 1, 2, 3; DeepSpeed's engine.save_checkpoint, as the
// HF Trainer and Megatron-DeepSpeed runs write it) as a TensorSource in HF names, the fp32 weights
// as deepspeed/utils/zero_to_fp32.py rebuilds them plus the Adam state, read in place (no whole
// partition is loaded: a read gathers the runs it needs from the ranks' files):
//   <dir>/latest                                  the tag, e.g. "global_step2"
//   <dir>/<tag>/mp_rank_00_model_states.pt        stages 1/2: {module, param_shapes, buffer_names,
//                                                 shared_params, frozen_param_shapes, global_steps, ds_version, ...}
//   <dir>/<tag>/zero_pp_rank_R_mp_rank_00_model_states.pt    stage 3 (one per rank, the same param_shapes)
//   <dir>/<tag>/[bf16_]zero_pp_rank_R_mp_rank_00_optim_states.pt   per data-parallel rank R:
//       {'optimizer_state_dict': {zero_stage: ZeroStageEnum, partition_count: int | [int],
//          stages 1/2: single_partition_of_fp32_groups [T per group], group_paddings [int],
//                      param_alignment_paddings [[int]]?, base_optimizer_state {state, param_groups}
//          stage 3:    fp32_flat_groups [T per group], optimizer_state_dict {state, param_groups}}}
//   torch's Adam/AdamW state: state[id] = {step, exp_avg, exp_avg_sq}, one flat id per param group
//   (param_groups[g]['params'] = [id]), the moments shaped as that group's fp32 partition.
// The layout of the partitions: converters/deepspeed/ds_partitions.h. The files are read by the
// restricted unpickler (formats/torch), never by running pickle code.
// Tensors: every parameter of param_shapes as F32 (its fp32 master: what zero_to_fp32 writes), and
// optimizer.exp_avg.<name> / optimizer.exp_avg_sq.<name> (kMegatronOptimPrefixes, the store's
// names) when the files hold the Adam state. Metadata: model_config (config.json in the directory
// or the step directory, as the HF Trainer saves it), adam (lr, betas, eps, weight_decay), deepspeed
// {detected, stage, world, dtype, tag, step_dir, ds_version, global_steps, optimizer_step}.
// Named errors (each with the file): DeepSpeedLatest (latest unreadable or naming no directory),
// DeepSpeedMissingRank (a rank's file absent), DeepSpeedPartitionCount (partition_count vs the rank
// files found, groups per rank), DeepSpeedNotZero (a file not of DeepSpeed's structure: the key and
// what it holds), DeepSpeedStage (an unknown or disagreeing zero_stage), DeepSpeedOptimizerState (a
// moment missing or not of its partition's size), DeepSpeedStepMismatch (ranks or groups at
// different steps), the layout's (ds_partitions.h), ForbiddenGlobal (the unpickler: module and class);
// Unsupported: tensor-parallel (mp_rank_01), expert-parallel files, frozen or shared parameters.
// Thread safety: read() and check_piece() may be called from several threads (one lock per source).
#pragma once

#include <memory>
#include <string>

#include "formats/tensor/tensor_io.h"

namespace ckpt {

// True when `path` is a DeepSpeed step directory (holds mp_rank_00_model_states.pt or
// zero_pp_rank_0_mp_rank_00_model_states.pt) or a directory with `latest` and such a step
// directory (file names only).
bool is_deepspeed_dir(const std::string& path);

// Opens such a directory (with `latest`: the tag it names) as above.
Result<std::unique_ptr<TensorSource>> open_deepspeed_dir(const std::string& path);

}  // namespace ckpt
