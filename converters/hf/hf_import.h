// Import of a HuggingFace LLaMA directory (single-file or sharded safetensors + config.json) into
// a native checkpoint: the plan (canonical tensors checked against config.json, target dtype,
// metadata {"model_config", "layout" tp=pp=dp=1, "profile", "hf_files" (tokenizer etc.)}) and its
// run through the reshard Executor into any TensorSink (the native store writer), or through the
// reshard planner into a native store of any layout (tp/pp/dp/zero). Thread safety: reentrant.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "converters/model/llama_config.h"
#include "formats/tensor/alias_view.h"
#include "formats/tensor/tensor_io.h"
#include "reshard/layout/layout.h"
#include "reshard/store_reshard.h"

namespace ckpt {

struct HfImportOptions {
  std::optional<DType> dtype;  // cast float tensors to this; nullopt keeps the HF dtypes
  int threads = 2;
  uint64_t max_chunk_bytes = 64ull << 20;  // executor chunk (output bytes)
  std::function<void(uint64_t, uint64_t)> progress;
  // Directory whose tokenizer/side files (converters/hf/hf_files.h) are carried into the metadata
  // ("hf_files"); empty: none.
  std::string side_files_dir;
  // Called after every byte is written, before the commit (the check of SRC: a DCP's zip CRC-32;
  // converters/source/source_check_job.h).
  std::function<Status()> before_commit;
  // Tensors imported as stored, never cast, beside the config's: a quantized checkpoint's payloads
  // and scales under --keep-quantized (converters/quant/quant_scheme.h).
  std::set<std::string> keep_as_stored;
};

struct HfImportPlan {
  LlamaConfig config;
  std::vector<TensorMeta> tensors;  // canonical order (llama_model_tensors), output dtypes
  std::vector<Piece> pieces;        // one whole piece per tensor
  nlohmann::json metadata;          // model_config (the HF object, dtype updated), layout, profile
  std::vector<std::string> skipped; // HF tensors not imported (rotary inv_freq; lm_head when tied)
  uint64_t total_bytes = 0;
  // An MoE family's source seen as the canonical tensors (converters/hf/hf_moe_names.h): the
  // view's tensors and their aliases onto the source's; empty for a dense model.
  std::vector<TensorMeta> alias_tensors;
  std::vector<TensorAlias> aliases;
};

// Needs metadata "model_config" (config.json). Every canonical tensor must be present with its
// shape (MissingTensor, ShapeMismatch); any other tensor is refused (UnexpectedTensor) except
// rotary_emb.inv_freq and, when embeddings are tied, lm_head.weight. An MoE family's experts may
// be stored per expert or fused, per layer (hf_moe_names.h).
Result<HfImportPlan> plan_hf_import(const TensorSource& src, const HfImportOptions& opts);

Status run_hf_import(TensorSource& src, TensorSink& sink, const HfImportPlan& plan, const HfImportOptions& opts);

// `src` as the import sees it: exactly plan.tensors (in the output dtypes), each with the source
// pieces of that tensor (stored dtypes; an MoE source's through plan.aliases); reads are
// forwarded. `src` must outlive the view.
Result<std::unique_ptr<TensorSource>> make_import_view(TensorSource& src, const HfImportPlan& plan);

// Imports into a new native store `dst` laid out as `layout` (LLaMA sharding rules, reshard
// planner and store executor; `dist` for mpirun, null for one process). The layout is refused
// before anything is written when the model cannot take it (LayoutRefused).
Status run_hf_import_to_layout(TensorSource& src, const HfImportPlan& plan, const Layout& layout, const std::string& dst,
                               const StoreExecOptions& opts, Comm* dist = nullptr);

}  // namespace ckpt
