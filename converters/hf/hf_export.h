// Export of a checkpoint's model weights to a HuggingFace directory (safetensors shards, index,
// config.json, tokenizer files): the plan (which tensors, target dtype, config) and its run
// through the reshard Executor into a ShardedSafetensorsSink. Canonical names ARE HF names
// (docs/DESIGN.md); optimizer.* and rotary inv_freq are left out. Thread safety: reentrant.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "converters/model/llama_config.h"
#include "formats/io/output_file.h"
#include "formats/tensor/alias_view.h"
#include "formats/tensor/tensor_io.h"

namespace ckpt {

struct HfExportOptions {
  std::optional<DType> dtype;                  // cast float tensors to this; nullopt keeps each tensor's dtype
  // Tensors written as stored, never cast, and allowed beside a model config's tensors: a quantized
  // checkpoint's payloads and scales under --keep-quantized (converters/quant/quant_scheme.h).
  std::set<std::string> keep_as_stored;
  // Model weights of the config stored under other names (MXFP4: X_blocks + X_scales for X), so
  // their absence is not MissingTensor; their stored tensors are in keep_as_stored.
  std::set<std::string> stored_elsewhere;
  uint64_t max_shard_size = 5'000'000'000ull;  // "5GB"
  int threads = 2;
  uint64_t max_chunk_bytes = 64ull << 20;  // executor chunk (output bytes); see exec_chunk_bytes()
  bool fsync = true;
  IoMode io = IoMode::kAuto;  // how shard bytes are written (formats/io/output_file.h)
  std::shared_ptr<SourceBlocks> read_ahead;  // copies read their sources direct through it (null: as io says)
  std::shared_ptr<WritePool> write_pool;     // direct writes in large requests, several in flight (null: per file)
  std::function<void(uint64_t, uint64_t)> progress;
  // Called after every byte is written, before the commit (the job's check of its SRC,
  // converters/source/source_check_job.h): an error leaves nothing at the destination.
  std::function<Status()> before_commit;
  // The safetensors header metadata of every shard ({"format": "np"} for PaddleNLP, which refuses "pt").
  std::map<std::string, std::string> shard_metadata = {{"format", "pt"}};
  // Integer tensors named like weights are written as they are (a stack whose convention stores
  // floats as integers: PaddleNLP's bf16 as U16); default: refused (NonFloatWeight).
  bool integer_weights = false;
};

struct HfExportPlan {
  std::vector<TensorMeta> tensors;        // output tensors, canonical order (LLaMA) or source order
  std::vector<Piece> pieces;              // one whole piece per tensor, in the output dtype
  std::optional<nlohmann::json> config;   // config.json to write (LLaMA mode), dtype updated
  std::map<std::string, std::string> copy_files;  // tokenizer files found beside the source (name -> path)
  std::map<std::string, std::string> side_files;  // tokenizer files carried in metadata "hf_files" (name -> content)
  std::vector<std::string> skipped;       // source tensors left out (optimizer state, inv_freq, ...)
  uint64_t total_bytes = 0;
  // An MoE family's canonical tensors under their HF per-expert names (hf_moe_names.h): the
  // names' view tensors (stored dtypes) and aliases onto the source's; empty for a dense model.
  std::vector<TensorMeta> alias_tensors;
  std::vector<TensorAlias> aliases;
};

// The HF dtype string of a ckpt dtype ("bfloat16", "float16", "float32"), or "" for others.
std::string hf_dtype_string(DType t);

// With metadata "model_config" (a LLaMA config): exactly the tensors of llama_model_tensors, each
// checked present with its shape (MissingTensor / ShapeMismatch), other non-optimizer tensors
// refused (UnexpectedTensor). Without: every non-optimizer tensor, as is (no config.json).
// Tokenizer/side files: those carried in metadata "hf_files" (checked against their SHA-256), else
// those found in `src_path` when it is a directory.
Result<HfExportPlan> plan_hf_export(const TensorSource& src, const std::string& src_path, const HfExportOptions& opts);

// Writes `out` (a new directory, committed by renaming `<out>.partial`).
Status run_hf_export(TensorSource& src, const HfExportPlan& plan, const std::string& out, const HfExportOptions& opts);

// Runs an export plan's region copies from `src` (through the plan's aliases when it has them)
// into `sink` (the engine's execute with the plan's tensors and pieces); shared by the HF and DCP
// exports. `before_commit` as ExecOptions'.
Status execute_export_plan(TensorSource& src, TensorSink& sink, const HfExportPlan& plan, int threads, uint64_t max_chunk_bytes,
                           const std::function<void(uint64_t, uint64_t)>& progress,
                           const std::function<Status()>& before_commit = nullptr);

// Validates a config object as LLaMA and returns it with its dtype keys set to `dt`.
Result<nlohmann::json> hf_config_with_dtype(const nlohmann::json& config, std::optional<DType> dt);

}  // namespace ckpt
