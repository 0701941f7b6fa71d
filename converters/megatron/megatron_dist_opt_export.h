// What every export of Megatron's distributed optimizer shares (legacy distrib_optim.pt,
// converters/megatron/megatron_torch_export.h; torch_dist dp_reshardable,
// converters/megatron/dist/megatron_dist_export.h): the settings the bucket layout depends on (taken
// from flags, recorded in the args written, so the import derives the same layout), the check that
// the source holds the optimizer state, each model-parallel group's bucket contents (canonical
// boxes, converters/megatron/dist_optim_group.h) and the param groups DistributedOptimizer.
// state_dict() saves.
// Named errors: DistOptNoOptimizerState (the source has no optimizer.exp_avg.* /
// optimizer.exp_avg_sq.*), MegatronOneMomentExport (exp_avg only, and the source's args.optimizer is
// not 'lion': which one-moment optimizer is not known), MegatronOptimizerMissingMoment (exp_avg_sq
// only), DistOptNeedsLocalSpec
// (Transformer Engine names: only the local spec's parameter order is known), DistOptBadFlag (dp or
// bucket size out of range), DistOptNoStep (no optimizer step recorded in the source),
// UnsupportedDistOptim (a sharding type other than dp_reshardable / fully_reshardable).
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "converters/megatron/dist_optim_group.h"
#include "formats/tensor/tensor_io.h"
#include "formats/torch/pickle/py_object.h"

namespace ckpt {

struct MegatronDistOptOptions {
  bool enabled = false;
  int64_t dp = 1;                      // data-parallel size the buckets are padded for (lcm(dp, 128))
  std::optional<int64_t> bucket_size;  // DDP bucket size in elements; none: one bucket (no overlap_grad_reduce)
  // torch_dist: "dp_reshardable" (the buckets) or "fully_reshardable" (per parameter, model keys).
  std::string sharding = "dp_reshardable";
};

// The args fields of the distributed optimizer (use_distributed_optimizer, data_parallel_size,
// world_size = tp * pp * dp, ddp_bucket_size, overlap_grad_reduce, grad_reduce_in_fp32,
// transformer_impl "local", optimizer) and the optimizer's hyper-parameters (lr, min_lr,
// weight_decay, and adam_beta1/2, adam_eps, or for `optim["optimizer"]` 'lion' lion_beta1/2) from
// `optim` (megatron_optimizer_fields).
nlohmann::json dist_opt_args(const MegatronDistOptOptions& o, int tp, int pp, const nlohmann::json& optim);

// The source's optimizer state as Megatron writes it: {"step", "lr", "min_lr", "max_lr", "beta1",
// "beta2", "eps", "weight_decay"} from its metadata (imported Megatron checkpoint: megatron.
// optimizer_step / megatron.adam, the param groups' values whatever the optimizer; ckpt's trainer:
// trainer.step / adamw / lr_schedule).
nlohmann::json megatron_optimizer_fields(const nlohmann::json& meta);

// What a --dist-opt export writes of the source's state: whether it holds fp32 masters
// (optimizer.fp32_param.*; without them the masters are the weights) and which optimizer's state it
// is: "adam" (exp_avg and exp_avg_sq, a step) or "lion" (exp_avg only, no step: megatron-core 0.19's
// DistributedOptimizer over emerging_optimizers' Lion, optimizer_state_keys ('exp_avg',)).
struct DistOptSourceState {
  bool fp32_masters = false;
  std::string optimizer = "adam";
};
// The checks of a --dist-opt export of `src` (before anything is written): the moments its
// optimizer keeps (Adam both, a step; exp_avg alone only with args.optimizer 'lion' recorded in the
// source's megatron_args), the local spec's names, dp and bucket size in range.
Result<DistOptSourceState> check_dist_opt_source(const TensorSource& src, const MegatronDistOptOptions& o, bool local_norms);

// MegatronOneMomentExport for `src` holding optimizer.exp_avg.* without optimizer.exp_avg_sq.* (a
// one-moment optimizer's state; `what`: the export asked for) where it cannot be written: without
// --dist-opt (FP32Optimizer's per-parameter state of Lion: not written yet), or when the source does
// not record args.optimizer 'lion' (which one-moment optimizer is not known).
Status one_moment_refused(const TensorSource& src, const std::string& what);
// The source's recorded args.optimizer (metadata megatron_args.optimizer), "" when none.
std::string source_optimizer(const TensorSource& src);

// One model-parallel group's buffers: per bucket the padded and unpadded sizes, and per state
// ("param" = fp32 masters, "exp_avg", "exp_avg_sq"; args.optimizer 'lion': no exp_avg_sq) the flat
// segments of [0, numel_unpadded).
struct DistOptGroupBuffers {
  int tp_rank = 0, pp_rank = 0;
  int group = 0;  // Megatron's dp_group_idx: pp_rank * tp + tp_rank (the file of its rank)
  int chunk = 0;  // the model chunk whose grad buffer this is (gbuf_idx; 0 without a virtual pipeline)
  std::vector<int64_t> numel, numel_unpadded;
  std::map<std::string, std::vector<std::vector<MegatronSegment>>> states;
};
// Every group of `layout` (pp_rank * tp + tp_rank = Megatron's dp_group_idx), laid out from
// `args` (dist_opt_args) by dist_optim_group: the import's own derivation. With a virtual pipeline
// (`vpp` > 1) one buffer per model chunk of each group (chunk c over its chunk stage of the plain
// pipeline, megatron_vpp.h), in the order group, then chunk.
Result<std::vector<DistOptGroupBuffers>> dist_opt_buffers(const LlamaConfig& cfg, const Layout& layout,
                                                          const nlohmann::json& args, bool fp32_masters,
                                                          const std::string& where, int vpp = 1);

// The name of a staged legacy world buffer: distrib_optim.<state> (MegatronSink, 1-D fp32).
inline constexpr const char* kDistOptStagedPrefix = "distrib_optim.";
// The states of a distributed optimizer's buffers, in Megatron's order.
inline constexpr const char* kDistOptStates[] = {"param", "exp_avg", "exp_avg_sq"};

// One param group as megatron-core's _get_param_groups + torch AdamW leave it in state_dict()
// (`ids`: the 'params' entry; DistributedOptimizer.state_dict() drops it and adds 'step'). With
// optim["optimizer"] 'lion': emerging_optimizers' Lion group as megatron-core 0.19.2 saves it (the
// _get_param_groups keys, lr, betas, weight_decay; no step, no eps).
const torch::PyObj* megatron_param_group(torch::PyArena& a, const nlohmann::json& optim, bool no_decay,
                                         std::optional<std::vector<const torch::PyObj*>> ids);
// DistributedOptimizer.state_dict()'s 'optimizer': {'param_groups': [decay, no decay]}, each with
// 'step' (a float, as torch AdamW without Apex/TE keeps it; none for Lion) and no 'params'.
const torch::PyObj* dist_opt_param_groups(torch::PyArena& a, const nlohmann::json& optim);
// The dtype key (torch.<param dtype>, torch.float32) of the grad buffer (grad_reduce_in_fp32).
const torch::PyObj* dist_opt_dtype_key(torch::PyArena& a, DType param_dtype);

}  // namespace ckpt
