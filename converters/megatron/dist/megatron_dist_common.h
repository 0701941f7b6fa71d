// The non-tensor parts of a Megatron-Core torch_dist checkpoint: where it is (an iteration dir
// whose metadata.json says {"sharded_backend": "torch_dist"}, or a run dir whose
// latest_checkpointed_iteration.txt names one: iter_%07d, or "release"), and what its common state
// holds: `common.pt` (megatron-core <= 0.18), or since 0.19 the ShardedObject `common_state` (the DCP
// bytes item `common_state/shard_0_1`, a torch.save of [state] inside a .distcp file); either read
// with the restricted unpickler, never executed: args (argparse.Namespace) as JSON, iteration, the
// optimizer's step (common_step, or the step of param_groups), the distributed optimizer's sharding
// type; and the model config those args give.
// Thread safety: reentrant.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "converters/model/llama_config.h"
#include "formats/base/status.h"
#include "formats/torch/dcp/dcp.h"

namespace ckpt {

// The torch_dist iteration dir `path` is or points to (by file names: metadata.json and
// .metadata); nullopt when it is neither.
std::optional<std::string> find_megatron_dist_dir(const std::string& path);

struct MegatronDistCommon {
  nlohmann::json args = nlohmann::json::object();  // scalar attributes of the args Namespace
  std::optional<int64_t> iteration;
  std::optional<int64_t> optimizer_step;           // optimizer.state.common_step, else param_groups' step
  std::string sharding_type;                       // content_metadata.distrib_optim_sharding_type, else
                                                   // optimizer.param_state_sharding_type ("" when none)
  std::string source;                              // "common.pt" or the DCP item "common_state/shard_0_1"
  nlohmann::json adam = nlohmann::json::object();  // the param groups' hyper-parameters (megatron_adam_hyper)
  // The distributed optimizer's param_groups items (optimizer.distributed.dp_group_idx_<g>.optimizer)
  // were read: with a step, or without one (Lion keeps no step).
  bool groups_read = false;
  // Megatron-LM's OptimizerParamScheduler.state_dict() (max_lr, min_lr, lr_warmup_steps, lr_decay_steps,
  // lr_decay_style, num_steps, ...): its scalar entries; empty when the common state has none.
  nlohmann::json opt_param_scheduler = nlohmann::json::object();
};

// The DCP bytes item megatron-core 0.19 writes the common state to.
inline constexpr const char* kMegatronCommonStateItem = "common_state/shard_0_1";

// Checks metadata.json (sharded_backend "torch_dist") and reads the common state: `<dir>/common.pt`
// when present, else the `common_state` item of the DCP (`md`: the directory's .metadata already
// read; nullptr: read here). Its offset and length must lie inside its .distcp file
// (BadMegatronCommonState), its bytes a torch.save of a list holding the state dict; neither
// common.pt nor the item: MissingMegatronCommonState. Errors name the file and the entry.
Result<MegatronDistCommon> read_megatron_dist_common(const std::string& dir, const torch::DcpMetadata* md = nullptr);

// The model config from the args (Megatron-LM names: num_layers, hidden_size, ffn_hidden_size,
// num_attention_heads, num_query_groups (group_query_attention false: = heads), kv_channels
// (absent: hidden / heads), vocab_size (absent: `padded_vocab`), untie_embeddings_and_output_
// weights, swiglu (must not be false), norm_epsilon, rotary_base, max_position_embeddings),
// bounded and type-checked: BadMegatronArgs naming `file` and the key.
Result<LlamaConfig> llama_config_from_megatron_args(const nlohmann::json& args, int64_t padded_vocab,
                                                    const std::string& file);

}  // namespace ckpt
