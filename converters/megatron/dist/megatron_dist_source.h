// A Megatron-Core torch_dist checkpoint (converters/megatron/dist/megatron_dist_common.h finds it) as a
// TensorSource in canonical HF view, on top of the DCP source (formats/torch/dcp/dcp.h): the config
// comes from the common state's args (common.pt, or megatron-core 0.19's common_state item: layers,
// hidden, heads, query groups, kv channels, ffn, vocab, tie, rope base, norm epsilon), the padded
// vocabulary from the embedding's shape; every stacked
// mcore tensor is checked (present, exact global shape) and each non-padding segment of the
// torch_dist map (converters/megatron/dist/megatron_dist_map.h), intersected with each DCP chunk, is a piece of
// its canonical tensor read in place through the DCP source (so any TP/PP chunking of the save,
// virtual pipeline chunks included: their layer offsets are global, works). Optimizer entries, where
// present: fp32 masters (optimizer.state.fp32_param.<key>, or the distributed optimizer's
// fully_reshardable optimizer.state.param.<key>) replace the model weight, optimizer.state.exp_avg /
// exp_avg_sq.<key> become optimizer.exp_avg / exp_avg_sq.<HF name>; the dp_reshardable buckets
// (converters/megatron/dist/megatron_dist_optim.h: layout derived from the args, checked against
// the recorded sizes) and dp_zero_gather_scatter's param_state world buffers give masters and moments
// the same way; every other optimizer.* tensor or item (buckets of a form not read) is named in
// megatron.optimizer_not_imported (+ _keys, optimizer_sharding_type), never dropped silently.
// Metadata: model_config, megatron_args, megatron {iteration, optimizer_step, tp, pp,
// virtual_pipeline?}, layout (none with a virtual pipeline). check(): the DCP items' and the common
// state's zip CRC-32s, and the checkpoint's own integrity.json (SHA-256 per file) when present.
// One thread at a time.
#pragma once

#include <memory>
#include <string>

#include "formats/tensor/tensor_io.h"

namespace ckpt {

// True when `path` is a torch_dist iteration dir or a run dir pointing to one.
bool is_megatron_dist_dir(const std::string& path);

Result<std::unique_ptr<TensorSource>> open_megatron_dist(const std::string& path);

}  // namespace ckpt
