// The flag text of the jobs, parsed once at the edge (cli/cmd_*.cc, python/commands_bind.cc) into
// the typed values their requests take (converters/jobs/reshard_job.h, converters/jobs/hf_jobs.h).
// Every error is kInvalidArgument naming the CLI flag (python's keyword arguments have the same
// names), as the jobs said before they took typed values. Pure functions; thread safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "formats/base/io_mode.h"
#include "formats/base/status.h"
#include "formats/dtype/dtype.h"
#include "formats/store/store_options.h"
#include "reshard/layout/layout.h"

namespace ckpt {

// --max-memory "256M", "1G", ... (formats/base/byte_size.h) in bytes.
Result<uint64_t> parse_max_memory(const std::string& text);

// --max-shard-size "5GB", "500MB", "2GiB", ... in bytes.
Result<uint64_t> parse_max_shard_size(const std::string& text);

// --io "direct", "buffered" or "auto" (formats/io/output_file.h).
Result<IoMode> parse_io_flag(const std::string& text);

// A native store's output flags: --compress (none, zstd[:LEVEL], shuffle+zstd[:LEVEL]), --digest
// (xxh3-128, sha256) and --io (direct, buffered, auto), parsed in that order into the codec, digest
// and io of the store options (the job fits the rest to --max-memory).
Result<store::StoreOptions> parse_store_flags(const std::string& compress, const std::string& digest, const std::string& io);

// --dtype of the exports: empty = keep each tensor's dtype; else bf16, fp16 or fp32 (any float
// dtype name); anything else is kInvalidArgument naming the flag.
Result<std::optional<DType>> float_dtype_flag(const std::string& value);

// --layout FILE (Layout::from_file: errors carry the file); "" is none given.
Result<std::optional<Layout>> parse_layout_file(const std::string& file);

}  // namespace ckpt
