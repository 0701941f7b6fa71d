// The LEGACY Megatron-LM layout written from a staged per-rank safetensors directory (what
// MegatronSink writes): for every rank, mp_rank_TT[_PPP]/model.safetensors becomes
//   <dst>/iter_NNNNNNN/mp_rank_TT[_PPP]/model_optim_rng.pt
// a torch.save file (formats/torch/torch_file_writer.h) of
//   {'args': argparse.Namespace(<megatron_args>, params_dtype=torch.<dtype>, bf16, fp16),
//    'checkpoint_version': 3.0, 'iteration': N,
//    'model': OrderedDict(<mcore name>: tensor, <linear module>._extra_state: None, ...),
//    'optimizer': ...}
// as megatron/training/checkpointing.py saves it (model entries in megatron-core's
// named_parameters order). 'optimizer' is written when the staged files hold
// optimizer.exp_avg.<mcore name> / optimizer.exp_avg_sq.<mcore name> (and, for bf16/fp16 weights,
// optimizer.fp32_param.<mcore name>) for every parameter: megatron-core's FP32Optimizer /
// Float16OptimizerWithFloat16Params state_dict over torch AdamW with _get_param_groups' two
// groups (layout in converters/megatron/megatron_torch_optim.h), each parameter's 'step' a float32
// 0-dim tensor of its own.
// The _extra_state entries are what megatron-core's linear layers put in their state dicts. Plus <dst>/latest_checkpointed_iteration.txt. Tensor
// bytes are copied from the staged files (write_from_file), never held in memory.
// Output goes to <dst>.partial, renamed to <dst> when complete. Thread safety: reentrant.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include <vector>

#include "formats/base/status.h"
#include "reshard/layout/layout.h"

namespace ckpt {

class WritePool;

Status megatron_torch_from_staging(const std::string& staging, const std::string& dst, const Layout& layout,
                                   const nlohmann::json& args, int64_t iteration,
                                   const nlohmann::json& optim = nlohmann::json::object(), int vpp = 1,
                                   WritePool* write_pool = nullptr, const std::vector<std::string>& rank_dirs = {});
// `rank_dirs` (MoE, vpp 1): the rank directories to convert (mp_rank_TT[_PPP]_EEE), each staged
// under the same name; empty: every (tp, pp) rank of `layout`.
// `optim`: {"step": Adam steps, "lr", "min_lr", "beta1", "beta2", "eps", "weight_decay"} for the
// param groups (defaults: torch's).
// `vpp` > 1: a virtual pipeline. `layout` is then the staged plain pipeline of pp * vpp chunk
// stages (converters/megatron/megatron_vpp.h); rank (tp r, stage p) of the pp = layout.pp / vpp
// real stages gets 'model0' .. 'model{vpp-1}' (chunk c = staged stage c * pp + p, its layers
// numbered from 0 as Megatron-LM saves them) instead of 'model', and no 'optimizer'.
// `write_pool`: the rank files' (and distrib_optim.pt's) direct writes staged there (TorchWriteOptions).

}  // namespace ckpt
