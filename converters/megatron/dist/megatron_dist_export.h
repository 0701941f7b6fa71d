// export-megatron --format torch_dist: a checkpoint's model weights (any source in global view)
// as a Megatron-Core torch_dist checkpoint directory, the one megatron.core.dist_checkpointing.
// load(model.sharded_state_dict(), dir) reads for a GPTModel of that layout:
//   <dst>/__<rank>_0.distcp, .metadata   through the DCP writer (formats/torch/dcp/dcp_writer.h): the
//        sharded keys and chunking megatron-core itself writes (converters/megatron/dist/megatron_dist_map.h),
//        each chunk in the file of the rank that owns it (pp_rank * tp + tp_rank);
//        <module>._extra_state/shard_<layer>_<layers> bytes items (torch.save([None]), what the
//        local spec's linear layers save) for linear_qkv, linear_proj, linear_fc1, linear_fc2;
//   the common state {'args': argparse.Namespace(megatron_args), 'checkpoint_version': 3.0,
//        'iteration': N, 'optimizer': {'state': {'common_step': step}} with optimizer state}:
//        opts.megatron_version 0.19 (default): the DCP bytes item common_state/shard_0_1 =
//        torch.save([state]) in rank 0's file (ShardedObject 'common_state', serialization.py) and
//        <dst>/metadata.json {"sharded_backend": "torch_dist", "sharded_backend_version": 1};
//        0.16 .. 0.18: <dst>/common.pt = torch.save(state) and metadata.json with "common_backend":
//        "torch", "common_backend_version": 1; any other: UnsupportedMegatronVersion.
// Optimizer state: the source's optimizer.{exp_avg,exp_avg_sq,fp32_param}.<HF name> tensors become
// megatron-core's sharded optimizer keys optimizer.state.<kind>.<model key>, chunked like their
// parameter (FP32Optimizer / Float16OptimizerWithFloat16Params.sharded_state_dict,
// megatron/core/dist_checkpointing/optimizer.py make_sharded_optimizer_tensor); the step (trainer
// step or imported Megatron optimizer_step, else the iteration) as common_step. The param groups
// are not written (megatron-core rebuilds them from the model when it loads).
// opts.dist_opt: instead, the distributed optimizer's dp_reshardable state (per model-parallel
// group, bucket and state the 1-D tensor optimizer.distributed.dp_group_idx_{g}.gbuf_idx_0.
// dtype_{(dtype, torch.float32)}.bucket_idx_{b}.{param|exp_avg|exp_avg_sq} of numel_unpadded
// elements; the ShardedObjects .optimizer (param groups with the step), .per_bucket_numel(_unpadded);
// the common state's 'optimizer': {'param_state_sharding_type': 'dp_reshardable'} and
// 'content_metadata'), laid out by converters/megatron/megatron_dist_opt_export.h; docs/MEGATRON_DIST.md.
// Written as <dst>.partial and renamed when complete; `dst` must not exist. Vocab padding rows
// are zeros.
// Thread safety: reentrant.
#pragma once

#include <string>

#include "converters/megatron/megatron_export.h"

namespace ckpt {

Status export_megatron_dist(TensorSource& src, const std::string& dst, const MegatronExportOptions& opts);

}  // namespace ckpt
