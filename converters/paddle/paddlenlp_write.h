// What ckpt writes for PaddleNLP (`ckpt to-hf SRC OUT --profile paddlenlp|paddlenlp-fused`,
// docs/PADDLENLP.md "Writing"): a canonical source presented as PaddleNLP 2.8.1's save_pretrained
// writes it with safe_serialization: the profile's tensors (llama.* names, linear weights and
// lm_head [in, out], qkv_proj / gate_up_fused_proj when fused), bf16 as U16 (PaddleNLP cannot read
// BF16 safetensors), and the config.json PaddleNLP's from_pretrained loads: HF keys plus
// fuse_attention_qkv / fuse_attention_ffn as written, "dtype" (bfloat16, float16; float32 as
// PaddleNLP writes it: absent) and no torch_dtype. The shards' header metadata is {"format": "np"}
// (the caller's writer; PaddleNLP refuses "pt" without convert_from_torch). One dtype for every
// tensor (PaddleNLP's config has one): mixed dtypes need --dtype (PaddleNlpMixedDtypes).
// Thread safety: as the views.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "formats/base/status.h"
#include "formats/tensor/tensor_io.h"

namespace ckpt {

struct PaddleNlpExport {
  std::unique_ptr<TensorSource> view;  // PaddleNLP's tensors; metadata without model_config (tensors as they are)
  nlohmann::json config;               // config.json
  std::string profile;                 // the profile written
};

// True for the profiles written as PaddleNLP files (paddlenlp, paddlenlp-fused).
bool is_paddlenlp_profile(const std::string& name);

// The view of `canon` (canonical tensors with a model_config; must outlive the view) in built-in
// profile `profile`, its weights cast to `dtype` when given.
Result<PaddleNlpExport> paddlenlp_export_view(TensorSource& canon, const std::string& profile, std::optional<DType> dtype);

}  // namespace ckpt
