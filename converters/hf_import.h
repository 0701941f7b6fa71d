// Import of a HuggingFace LLaMA directory (single-file or sharded safetensors + config.json) into
// a native checkpoint: the plan (canonical tensors checked against config.json, target dtype,
// metadata {"model_config", "layout" tp=pp=dp=1, "profile"}) and its run through the reshard
// Executor into any TensorSink (the native store writer). Thread safety: reentrant.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "converters/llama_config.h"
#include "formats/tensor_io.h"

namespace ckpt {

struct HfImportOptions {
  std::optional<DType> dtype;  // cast float tensors to this; nullopt keeps the HF dtypes
  int threads = 2;
  std::function<void(uint64_t, uint64_t)> progress;
};

struct HfImportPlan {
  LlamaConfig config;
  std::vector<TensorMeta> tensors;  // canonical order (llama_model_tensors), output dtypes
  std::vector<Piece> pieces;        // one whole piece per tensor
  nlohmann::json metadata;          // model_config (the HF object, dtype updated), layout, profile
  std::vector<std::string> skipped; // HF tensors not imported (rotary inv_freq; lm_head when tied)
  uint64_t total_bytes = 0;
};

// Needs metadata "model_config" (config.json). Every canonical tensor must be present with its
// shape (MissingTensor, ShapeMismatch); any other tensor is refused (UnexpectedTensor) except
// rotary_emb.inv_freq and, when embeddings are tied, lm_head.weight.
Result<HfImportPlan> plan_hf_import(const TensorSource& src, const HfImportOptions& opts);

Status run_hf_import(TensorSource& src, TensorSink& sink, const HfImportPlan& plan, const HfImportOptions& opts);

}  // namespace ckpt
