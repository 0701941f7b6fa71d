// One `ckpt export-dcp` and one `ckpt export-megatron` run below the CLI (cli/cmd_export_dcp.cc,
// cli/cmd_export_megatron.cc; python ckpt.export_dcp / ckpt.export_megatron): the source opened
// (open_checkpoint: every kind ckpt reads, in global view) and checked by its format's own checks
// before the commit (converters/source/source_check_job.h, in a child forked before this process
// opens it), then the export of converters/dcp/dcp_export.h or converters/megatron/megatron_export.h
// and converters/megatron/dist/megatron_dist_export.h. Outputs are written under a temporary name
// and renamed when complete; on failure nothing is left at the destination. The requests carry
// typed values, parsed at the edge with errors naming the CLI flag (converters/jobs/job_flags.h,
// megatron_format_flag below); the jobs check their ranges, naming the flag as well.
// Thread safety: one job at a time per process (each may fork a verifier).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "converters/jobs/memory_fit.h"
#include "formats/base/status.h"
#include "formats/dtype/dtype.h"

namespace ckpt {

struct ExportDcpRequest {
  std::string src, out;
  std::string source_profile;        // --source-profile: SRC stored in this profile (converters/source/open_checkpoint.h)
  std::optional<DType> dtype;  // --dtype: cast float tensors to it; none keeps each tensor's dtype
  int files = 1;               // __R_0.distcp files (writer ranks), 1..4096
  bool source_chunks = false;  // one chunk per distinct box of the source's pieces (else one per tensor)
  int threads = 2;             // 1..64
  uint64_t max_memory = kDefaultMaxMemory;  // bytes of --max-memory
  IoMode io = IoMode::kAuto;   // --io: how the .distcp files are written
  bool fsync = true;
  bool no_verify = false;      // skip the check of SRC before the commit
  std::function<void(uint64_t, uint64_t)> progress;
};

struct ExportDcpOutcome {
  std::string out;
  size_t tensors = 0, chunks = 0;
  uint64_t bytes = 0;
  int files = 0;
  std::vector<std::string> skipped;  // non-model tensors left out
  nlohmann::json source_check;       // how SRC was checked (JobSourceCheck::to_json)
  MemoryFit memory;                  // --max-memory against the job's floor
  nlohmann::json io = nlohmann::json::object();  // how the files were written (io_report, memory_fit.h)
  // The JSON of `ckpt export-dcp --json`: {out, tensors, chunks, bytes, files, skipped, source_check, memory, io}.
  nlohmann::json to_json() const;
};

Result<ExportDcpOutcome> run_export_dcp_job(const ExportDcpRequest& req);

enum class MegatronExportFormat {
  kSafetensors,  // per-rank safetensors + megatron_args.json (converters/megatron/megatron_export.h)
  kTorch,        // Megatron-LM's legacy per-rank torch files (same header)
  kTorchDist,    // a Megatron-Core torch_dist directory (converters/megatron/dist/megatron_dist_export.h)
};

// --format: "safetensors", "torch" or "torch_dist"; anything else is kInvalidArgument naming the flag.
Result<MegatronExportFormat> megatron_format_flag(const std::string& value);
// The --format name of `f`.
const char* megatron_format_name(MegatronExportFormat f);

struct ExportMegatronRequest {
  std::string src, dst;
  std::string source_profile;        // --source-profile: SRC stored in this profile (converters/source/open_checkpoint.h)
  MegatronExportFormat format = MegatronExportFormat::kSafetensors;
  int tp = 1, pp = 1;                  // 1..65536
  int ep = 1, etp = 0;                 // MoE: expert parallel and expert TP sizes (0: tp); docs/MOE.md
  std::vector<int> pp_layers;          // layers per pipeline stage; empty: even split
  int vpp = 1;                         // --vpp: virtual pipeline chunks per stage (torch, torch_dist), 1..65536
  int64_t vocab_divisor = 128;         // make-vocab-size-divisible-by, 1..2^20
  std::optional<DType> dtype;          // --dtype: a float dtype; none keeps the source's
  bool local_norms = false;            // local-spec norm names instead of Transformer Engine's
  int64_t iteration = 0;               // format torch: the iteration saved as, 0..9999999
  bool dist_opt = false;               // --dist-opt: the optimizer state as Megatron's distributed optimizer
  int64_t dp = 1;                      // --dp: its data-parallel size, 1..2^20
  std::optional<int64_t> ddp_bucket_size;  // --ddp-bucket-size (elements); none: one bucket
  std::string dist_opt_sharding = "dp_reshardable";  // --dist-opt-sharding (torch_dist): or fully_reshardable
  std::string megatron_version;        // --megatron-version (torch_dist only): 0.16 .. 0.19; "": the newest
  bool no_verify = false;              // skip the check of SRC before the commit
  std::function<void(uint64_t, uint64_t)> progress;
};

struct ExportMegatronOutcome {
  std::string out;
  MegatronExportFormat format = MegatronExportFormat::kSafetensors;
  int tp = 1, pp = 1, vpp = 1;
  int64_t iteration = 0;
  bool dist_opt = false;
  int64_t dp = 1;
  nlohmann::json source_check;  // how SRC was checked (JobSourceCheck::to_json)
  nlohmann::json io = nlohmann::json::object();  // how the files were written (io_report, memory_fit.h)
  // The JSON of `ckpt export-megatron --json`: {out, format, tp, pp, vpp, iteration, dist_opt, dp, source_check, io}.
  nlohmann::json to_json() const;
};

Result<ExportMegatronOutcome> run_export_megatron_job(const ExportMegatronRequest& req);

}  // namespace ckpt
