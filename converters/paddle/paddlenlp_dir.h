// PaddleNLP directories as sources (docs/PADDLENLP.md). A directory is PaddleNLP's when it holds
// model_state.pdparams or model_state.pdparams.index.json, or model.safetensors[.index.json] with a
// config.json carrying PaddleNLP's own keys (fuse_attention_qkv, fuse_attention_ffn,
// tensor_parallel_output, paddlenlp_version). It opens as the canonical view (HF names, [out, in],
// q/k/v and gate/up apart) of the profile its tensor names show: `paddlenlp` (unfused),
// `paddlenlp-fused` (qkv_proj and gate_up_fused_proj), or that profile with one packing changed
// when the file fuses only one of them. Tensors stored as U16 are bf16 bit patterns when the
// config says "dtype": "bfloat16" (PaddleNLP's only marker) and read as BF16; otherwise they stay
// U16 and the jobs refuse them by name (converters/model/weight_dtype.h).
// The view's metadata: "model_config" in HF keys (hf_config_of_paddle), "paddlenlp_config" (the
// file's config.json), "source_profile", and "source_detected" ({kind, files, profile, dtype, why}):
// what was detected, which the jobs report.
// Thread safety: open is reentrant; the sources are as the canonical view states.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "converters/profile/profile.h"
#include "formats/base/status.h"
#include "formats/tensor/tensor_io.h"

namespace ckpt {

// A PaddleNLP directory or a .pdparams file. Looks at file names and (for safetensors) the keys
// of config.json; never fails.
bool is_paddlenlp_dir(const std::string& path);

// Opens a PaddleNLP directory (or a .pdparams file) in the profile its names show.
Result<std::unique_ptr<TensorSource>> open_paddlenlp_dir(const std::string& path);

// Opens `path` (a PaddleNLP or HF directory, a .safetensors or .pdparams file) with its tensors
// taken as stored in profile `p` (--source-profile): the canonical view of `p` over them, U16
// read as BF16 when the config's dtype is bfloat16. Errors: ProfileTensorMismatch naming a tensor
// the profile does not hold, NoModelConfig without a config.json.
Result<std::unique_ptr<TensorSource>> open_in_profile(const std::string& path, const Profile& p);

// The HF LlamaConfig keys of a PaddleNLP config.json ("dtype" -> "torch_dtype", float32 when
// absent; PaddleNLP-only keys dropped). PaddleNlpConfig when it asks for what transformers' LLaMA
// cannot do (rope scaling, alibi).
Result<nlohmann::json> hf_config_of_paddle(const nlohmann::json& paddle_config);

// The PaddleNLP profile matching stored tensor names: fused qkv when a name holds
// ".self_attn.qkv_proj.", fused ffn when one holds ".mlp.gate_up_fused_proj.".
Result<Profile> paddlenlp_profile_for(bool fused_qkv, bool fused_ffn);

}  // namespace ckpt
