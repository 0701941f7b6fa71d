// The non-tensor parts of a Megatron-Core torch_dist checkpoint: where it is (an iteration dir
// whose metadata.json says {"sharded_backend": "torch_dist"}, or a run dir whose
// latest_checkpointed_iteration.txt names one: iter_%07d, or "release"), and what common.pt
// holds (read with the restricted unpickler, never executed): args (argparse.Namespace) as JSON,
// iteration, the optimizer's common_step; and the model config those args give.
// Thread safety: reentrant.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "converters/model/llama_config.h"
#include "formats/base/status.h"

namespace ckpt {

// The torch_dist iteration dir `path` is or points to (by file names: metadata.json and
// .metadata); nullopt when it is neither.
std::optional<std::string> find_megatron_dist_dir(const std::string& path);

struct MegatronDistCommon {
  nlohmann::json args = nlohmann::json::object();  // scalar attributes of the args Namespace
  std::optional<int64_t> iteration;
  std::optional<int64_t> optimizer_step;           // optimizer.state.common_step
};

// Checks metadata.json (sharded_backend "torch_dist") and reads `<dir>/common.pt` (absent: an
// empty result). Errors name the file and the entry.
Result<MegatronDistCommon> read_megatron_dist_common(const std::string& dir);

// The model config from the args (Megatron-LM names: num_layers, hidden_size, ffn_hidden_size,
// num_attention_heads, num_query_groups (group_query_attention false: = heads), kv_channels
// (absent: hidden / heads), vocab_size (absent: `padded_vocab`), untie_embeddings_and_output_
// weights, swiglu (must not be false), norm_epsilon, rotary_base, max_position_embeddings),
// bounded and type-checked: BadMegatronArgs naming `file` and the key.
Result<LlamaConfig> llama_config_from_megatron_args(const nlohmann::json& args, int64_t padded_vocab,
                                                    const std::string& file);

}  // namespace ckpt
