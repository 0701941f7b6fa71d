// One `ckpt to-hf` and one `ckpt from-hf` run below the CLI (cli/cmd_to_hf.cc, cli/cmd_from_hf.cc;
// python ckpt.to_hf / ckpt.from_hf): the flag values in a request, the source opened, the plan
// made (converters/hf/hf_export.h, converters/hf/hf_import.h), the chunk size fitted to the memory
// budget, the run, and a summary. Outputs are written under a temporary name and renamed when
// complete. String values are parsed with errors naming the CLI flag (--dtype, --max-memory, ...).
// Thread safety: one job at a time per process (from-hf with a layout may fork a verifier).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "converters/jobs/profile_view_job.h"
#include "converters/jobs/reshard_job.h"
#include "converters/profile/exactness.h"
#include "formats/base/status.h"
#include "formats/dtype/dtype.h"
#include "formats/tensor/tensor_io.h"

namespace ckpt {

class Comm;

// --dtype of the exports: empty = keep each tensor's dtype; else bf16, fp16 or fp32 (any float
// dtype name); anything else is kInvalidArgument naming the flag.
Result<std::optional<DType>> float_dtype_flag(const std::string& value);

// The executor chunk size for copying `src`'s pieces into `out` pieces within `max_memory` less
// `reserve` (widest source element, narrowest output element; chunk_bytes_within).
Result<uint64_t> chunk_bytes_for_copy(const std::string& max_memory, int threads, const TensorSource& src,
                                      const std::vector<Piece>& out, uint64_t reserve = 0);

struct ToHfRequest {
  std::string src, out;
  std::string dtype;                 // "" keeps each tensor's dtype; bf16 | fp16 | fp32
  std::string max_shard_size = "5GB";
  int threads = 2;
  std::string max_memory = "256M";
  std::string io = "auto";
  bool fsync = true;
  bool no_verify = false;            // skip the check of SRC before the commit (converters/jobs/source_check_job.h)
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
  // {out, tensors, bytes, config, files, skipped, seconds, memory, source_check}
  nlohmann::json to_json() const;
};

Result<ToHfOutcome> run_to_hf_job(const ToHfRequest& req);

struct FromHfRequest {
  std::string src, out;
  std::string dtype;                 // "" keeps the HF dtypes; excludes `profile`
  std::string compress = "none", digest = "xxh3-128";
  LayoutValues layout;               // none given: tp=pp=dp=1, one file
  int threads = 2;
  std::string max_memory = "256M";
  std::string io = "auto";
  bool fsync = true;
  ProfileRequest profile;            // store in this profile (reshard job through the profile views)
  bool no_verify = false;            // skip the check of a DCP SRC's zip CRC-32 (converters/jobs/source_check_job.h)
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
  double seconds = 0;
  MemoryFit memory;                  // --max-memory against the job's floor (converters/jobs/memory_fit.h)
  // {out, layout, tensors, bytes, side_files, skipped, seconds, memory, profile?, exactness?}
  nlohmann::json to_json() const;
};

Result<FromHfOutcome> run_from_hf_job(const FromHfRequest& req);

}  // namespace ckpt
