// One `ckpt to-hf` and one `ckpt from-hf` run below the CLI (cli/cmd_to_hf.cc, cli/cmd_from_hf.cc;
// python ckpt.to_hf / ckpt.from_hf): SRC located and opened once (converters/source/job_source.h),
// the plan made (converters/hf/hf_export.h, converters/hf/hf_import.h), the chunk size fitted to
// the memory budget, the run, and a summary. Outputs are written under a temporary name and
// renamed when complete. The requests carry typed values, parsed at the edge with errors naming
// the CLI flag (converters/jobs/job_flags.h).
// Thread safety: one job at a time per process (from-hf with a layout may fork a verifier).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "converters/jobs/job_flags.h"
#include "converters/jobs/memory_fit.h"
#include "converters/profile/exactness.h"
#include "converters/profile/profile_view_job.h"
#include "formats/base/status.h"
#include "formats/dtype/dtype.h"
#include "formats/io/output_file.h"
#include "formats/store/store_options.h"
#include "formats/tensor/tensor_io.h"
#include "reshard/layout/layout_values.h"

namespace ckpt {

class Comm;

// --max-shard-size when none is given ("5GB", HuggingFace's default).
inline constexpr uint64_t kDefaultMaxShardSize = 5'000'000'000;

struct ToHfRequest {
  std::string src, out;
  std::string source_profile;        // --source-profile: SRC stored in this profile (converters/source/open_checkpoint.h)
  std::optional<DType> dtype;        // --dtype: a float dtype; none keeps each tensor's dtype
  // --profile: "" or "hf" writes HF's files; paddlenlp / paddlenlp-fused PaddleNLP's
  // (converters/paddle/paddlenlp_write.h: llama.* names, [in, out], bf16 as U16, format np, its config.json).
  std::string profile;
  uint64_t max_shard_size = kDefaultMaxShardSize;  // bytes of --max-shard-size
  int threads = 2;                   // 1..64
  uint64_t max_memory = kDefaultMaxMemory;  // bytes of --max-memory
  IoMode io = IoMode::kAuto;         // --io: how SRC's copied ranges are read and the shards written
  bool fsync = true;
  bool no_verify = false;            // skip the check of SRC before the commit (converters/source/source_check_job.h)
  // A quantized SRC (converters/quant/quant_scheme.h) is written dequantized, its weights in --dtype
  // (bf16 when none); --keep-quantized writes payloads and scales as stored, quantization_config kept.
  bool keep_quantized = false;
  // --quantize fp8-block[:RxC]: the linear weights written as block-scaled FP8 (converters/quant/quantize_view.h)
  std::string quantize;
  std::function<void(uint64_t, uint64_t)> progress;
};

struct ToHfOutcome {
  std::string out;
  size_t tensors = 0;
  uint64_t bytes = 0;
  bool config = false;                // config.json written (LLaMA mode)
  std::vector<std::string> files;     // tokenizer/side files written beside the weights
  std::vector<std::string> skipped;   // non-model tensors left out
  double seconds = 0;
  MemoryFit memory;                   // --max-memory against the job's floor (converters/jobs/memory_fit.h)
  nlohmann::json source_check;        // how SRC was checked (JobSourceCheck::to_json)
  nlohmann::json io = nlohmann::json::object();  // how the shards were written (io_report, memory_fit.h)
  // A quantized SRC: {scheme, tensors, dequantized (bool), stored_bytes, dequantized_bytes}; else null.
  nlohmann::json quantization;
  nlohmann::json source;              // what SRC was detected as (source_detected_of), null for plain kinds
  std::string profile;                // the profile written when not HF's (paddlenlp, paddlenlp-fused)
  // {out, tensors, bytes, config, files, skipped, seconds, memory, source_check, io, quantization, source?, profile?}
  nlohmann::json to_json() const;
};

Result<ToHfOutcome> run_to_hf_job(const ToHfRequest& req);

struct FromHfRequest {
  std::string src, out;
  std::string source_profile;        // --source-profile: SRC stored in this profile (converters/source/open_checkpoint.h)
  std::optional<DType> dtype;        // --dtype: none keeps the HF dtypes; with `profile`: its model dtypes
  // Of OUT: codec and level (--compress), digest (--digest), how shards are written (--io), fsync
  // (--no-fsync). The job fits hash_threads, chunk_memory and read_ahead to max_memory.
  store::StoreOptions store;
  LayoutValues layout;               // none given: tp=pp=dp=1, one file
  int threads = 2;                   // 1..64
  uint64_t max_memory = kDefaultMaxMemory;  // bytes of --max-memory
  ProfileRequest profile;            // store in this profile (reshard job through the profile views)
  bool no_verify = false;            // skip the check of a DCP SRC's zip CRC-32 (converters/source/source_check_job.h)
  bool keep_quantized = false;       // a quantized SRC: store weights and scales as they are (default: dequantized, as to-hf)
  std::function<void(uint64_t, uint64_t)> progress;
  Comm* dist = nullptr;              // the world under mpirun; null: one process
};

struct FromHfOutcome {
  std::string out;
  std::string layout;                // "tp=1 pp=1 dp=1", ...
  size_t tensors = 0;
  uint64_t bytes = 0;
  std::vector<std::string> side_files;  // tokenizer/side files carried in the metadata
  std::vector<std::string> skipped;     // HF tensors not imported (inv_freq, tied lm_head)
  std::string profile;               // set when stored through a profile ...
  ExactnessReport exactness;         // ... with its exactness report
  nlohmann::json quantization;       // a quantized SRC: as ToHfOutcome::quantization; else null
  double seconds = 0;
  MemoryFit memory;                  // --max-memory against the job's floor (converters/jobs/memory_fit.h)
  nlohmann::json io = nlohmann::json::object();  // how OUT was written (store_io_report, memory_fit.h)
  nlohmann::json source;             // what SRC was detected as (source_detected_of), null for plain kinds
  // {source?, out, layout, tensors, bytes, side_files, skipped, seconds, memory, io, profile?, exactness?}
  nlohmann::json to_json() const;
};

Result<FromHfOutcome> run_from_hf_job(const FromHfRequest& req);

}  // namespace ckpt
