// One `ckpt reshard` run below the CLI: locate SRC once (converters/source/job_source.h: a native
// store, or any kind open_checkpoint reads that carries a model config: Megatron, DCP, HF), fit
// the store writer to the memory budget, start SRC's check, open SRC once, derive the LLaMA
// sharding rules from its model_config, take the target layout (a layout file, or the flag values
// keeping the source's other settings), size the chunks and make the plan; then, unless dry_run,
// execute it into a new native store at DST with SRC checked before commit
// (converters/source/source_check_job.h: in a child process forked before SRC is opened here,
// single-process runs; from the copies' own reads where they read SRC direct; inline on rank 0
// under MPI). The request carries typed values, parsed at the edge (converters/jobs/job_flags.h).
// Thread safety: one call at a time per process.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "converters/jobs/memory_fit.h"
#include "converters/model/llama_config.h"
#include "converters/profile/exactness.h"
#include "converters/profile/profile_view_job.h"
#include "formats/base/status.h"
#include "formats/store/store_options.h"
#include "reshard/layout/layout.h"
#include "reshard/layout/layout_values.h"
#include "reshard/planner.h"

namespace ckpt {

class Comm;

struct ReshardRequest {
  std::string src, dst;
  std::string source_profile;        // --source-profile: SRC stored in this profile (converters/source/open_checkpoint.h)
  std::optional<Layout> layout_file;  // --layout FILE, parsed; excludes `layout`
  LayoutValues layout;                // --tp --pp --dp --zero --pp-layers
  // Of DST: codec and level (--compress), digest of every piece (--digest), how shards are
  // written (--io). The job fits hash_threads, chunk_memory and read_ahead to max_memory.
  store::StoreOptions store;
  int threads = 2;
  uint64_t max_memory = kDefaultMaxMemory;  // bytes of --max-memory
  bool dry_run = false;    // plan only: nothing is written
  bool no_verify = false;  // skip checking SRC before commit
  // A block-quantized SRC whose target layout splits inside blocks (QuantSplitBlock otherwise):
  // re-quantize every quantized weight with the largest block the splits allow
  // (converters/quant/requantize.h); the exactness report counts the elements that changed.
  bool requantize = false;
  std::function<void(uint64_t, uint64_t)> progress;  // (bytes done, total) while executing; may be empty
  Comm* dist = nullptr;    // the world under mpirun (Comm::world()); null: a single process
  ProfileRequest profile;  // --profile / --profile-file / --saturate (converters/profile/profile_view_job.h)
};

// The target layout of a reshard of a source with model `cfg` and metadata `src_meta`: the layout
// file; or the flag values (on the model's layers), keeping the source layout's vocab divisor and
// profile; or, for a profile conversion given neither, the source's layout. kInvalidArgument when
// both or (outside a conversion of a laid-out source) neither are given.
Result<Layout> reshard_target_layout(const ReshardRequest& r, const LlamaConfig& cfg, const nlohmann::json& src_meta);

// What SRC's reads cost beside the executor's chunks on `threads` (TensorSource::read_memory: a
// compressed native store's decode buffers, formats/store/chunk_reader.h kDecodeThreadBytes).
uint64_t source_decode_reserve(const TensorSource& src, int threads);

struct ReshardOutcome {
  Plan plan;
  Layout layout;
  std::string src_description;  // TensorSource::describe() of SRC
  nlohmann::json source;        // what SRC was detected as (source_detected_of), null for plain kinds
  double plan_seconds = 0;      // making the plan
  double seconds = 0;           // plan and execution (0 for a dry run)
  int processes = 1;
  std::string profile;          // the profile of DST when the job went through the profile views
  std::string from_profile;     // ... and the one of SRC
  ExactnessReport exactness;    // merged over processes on rank 0
  MemoryFit memory;             // --max-memory against the job's floor (converters/jobs/memory_fit.h)
  // How SRC's digests were checked: "copy" (from the copy's direct reads, CopyVerify: with
  // bytes_from_copy and bytes_reread), "process" (a child process), "inline", or "none".
  nlohmann::json source_check = nlohmann::json::object();
  nlohmann::json io = nlohmann::json::object();  // how DST was written (store_io_report, memory_fit.h)
  // The JSON of `ckpt reshard --json` (converters/jobs/reshard_job_json.cc): the plan's summary with
  // plan_seconds and memory, and unless `dry_run` dst, seconds, processes, source_check, io (+ profile,
  // from_profile, exactness).
  nlohmann::json to_json(const std::string& dst, bool dry_run) const;
};

Result<ReshardOutcome> run_reshard_job(const ReshardRequest& req);

}  // namespace ckpt
