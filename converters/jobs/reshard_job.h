// One `ckpt reshard` run below the CLI: open SRC (a native store, or a Megatron-layout directory
// written by export-megatron), derive the LLaMA sharding rules from its model_config, build the
// target layout (--layout FILE, or the flag values keeping the source's other settings), size the
// chunks to the memory budget, make the plan and, unless dry_run, execute it into a new native
// store at DST with the SRC checksums re-verified before commit (reshard/source_verify.h: in a
// child process forked before SRC is opened here, single-process runs; inline on rank 0 under MPI).
// Thread safety: one call at a time per process.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "converters/jobs/memory_fit.h"
#include "converters/jobs/profile_view_job.h"
#include "converters/profile/exactness.h"
#include "formats/base/status.h"
#include "formats/store/store_options.h"
#include "reshard/layout/layout.h"
#include "reshard/planner.h"

namespace ckpt {

class Comm;

// The layout flag values (--tp --pp --dp --zero --pp-layers); 0 / -1 / empty means not given.
struct LayoutValues {
  int tp = 0, pp = 0, dp = 0, zero = -1;
  std::string pp_layers;  // "a,b,c": layers per pipeline stage

  bool given() const { return tp || pp || dp || zero >= 0 || !pp_layers.empty(); }
  // Requires tp, pp, dp >= 1; pp_layers must sum to `num_layers` (kInvalidArgument naming the flag).
  Result<Layout> make(int64_t num_layers) const;
};

// The executor chunk size that keeps its buffers within `max_memory` (e.g. "256M", parsed with
// errors naming --max-memory) less `reserve` bytes, for `threads` workers, the widest source and
// narrowest output element.
Result<uint64_t> chunk_bytes_within(const std::string& max_memory, int threads, size_t max_src_elem,
                                    size_t min_out_elem, uint64_t reserve = 0);

// Direct copies by `copy_threads` threads reading their sources through one SourceBlocks
// (formats/io/source_blocks.h): what `mem` (--max-memory) leaves beside `reserve`, the threads'
// stages and a 32 MiB chunk budget is read ahead, 64-512 MiB; `bytes` = stages + read-ahead, to
// add to the job's reserve. No blocks when less than 64 MiB is left.
struct ReadAheadFit {
  std::shared_ptr<SourceBlocks> blocks;
  uint64_t bytes = 0;
};
ReadAheadFit fit_read_ahead(uint64_t mem, uint64_t reserve, int copy_threads);

// How a job's native store writer fits --max-memory beside the executor's chunk buffers: sets
// so.hash_threads (the writer's pool) and so.chunk_memory (compressed chunks in flight) for
// `threads`; returns the bytes of --max-memory to reserve for the writer, HDF5 and the process.
// Uncompressed stores copy their sources with direct reads through so.read_ahead (SourceBlocks)
// when so.io is kDirect, or kAuto and `cold_source` (the source mostly out of the page cache:
// page_cache_share), and the budget leaves room for it.
Result<uint64_t> fit_store_writer(const std::string& max_memory, int threads, store::StoreOptions& so, bool cold_source = false);

// --io auto: whether the source at `path` (a file or directory; a native store's run dir resolved
// to its checkpoint) is mostly out of the page cache, so that direct reads beat mapped ones.
bool cold_source(const std::string& path, IoMode io);

// What SRC's reads cost beside the executor's chunks on `threads` (TensorSource::read_memory: a
// compressed native store's decode buffers, formats/store/chunk_reader.h kDecodeThreadBytes).
uint64_t source_decode_reserve(const TensorSource& src, int threads);

struct ReshardRequest {
  std::string src, dst;
  std::string layout_file;  // a layout JSON file; excludes `layout`
  LayoutValues layout;
  std::string compress = "none";  // none, zstd[:LEVEL], shuffle+zstd[:LEVEL] (errors name --compress)
  std::string digest = "xxh3-128";  // of every piece written: xxh3-128 or sha256 (errors name --digest)
  int threads = 2;
  std::string max_memory = "256M";
  std::string io = "auto";  // direct, buffered or auto: how output shards are written (errors name --io)
  bool dry_run = false;    // plan only: nothing is written
  bool no_verify = false;  // skip re-hashing SRC before commit
  std::function<void(uint64_t, uint64_t)> progress;  // (bytes done, total) while executing; may be empty
  Comm* dist = nullptr;    // the world under mpirun (Comm::world()); null: a single process
  ProfileRequest profile;  // --profile / --profile-file / --saturate (converters/jobs/profile_view_job.h)
};

struct ReshardOutcome {
  Plan plan;
  Layout layout;
  std::string src_description;  // TensorSource::describe() of SRC
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
  // The JSON of `ckpt reshard --json` (converters/jobs/reshard_job_json.cc): the plan's summary with
  // plan_seconds and memory, and unless `dry_run` dst, seconds, processes, source_check (+ profile,
  // from_profile, exactness).
  nlohmann::json to_json(const std::string& dst, bool dry_run) const;
};

Result<ReshardOutcome> run_reshard_job(const ReshardRequest& req);

}  // namespace ckpt
