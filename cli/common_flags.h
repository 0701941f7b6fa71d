// Flags shared by the commands that stream tensors and write checkpoints (reshard, from-hf,
// to-hf): the target layout (--tp --pp --pp-layers --dp --zero), the buffer budget and threads
// (--max-memory --threads) and how data files are written (--io). Each struct adds its options
// to a subcommand and turns them into library values; errors are kInvalidArgument naming the flag.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "converters/jobs/hf_jobs.h"  // float_dtype_flag, chunk_bytes_for_copy
#include "converters/jobs/reshard_job.h"
#include "formats/base/status.h"
#include "formats/dtype/dtype.h"
#include "formats/io/output_file.h"
#include "formats/tensor/tensor_io.h"
#include "reshard/layout/layout.h"

namespace ckpt::cli {

struct LayoutFlags {
  int tp = 0, pp = 0, dp = 0, zero = -1;
  std::string pp_layers;

  void add(CLI::App& sub, const std::string& zero_help);
  LayoutValues values() const { return {tp, pp, dp, zero, pp_layers}; }
  bool given() const { return values().given(); }
  // Requires --tp --pp --dp (each >= 1); --pp-layers must sum to `num_layers`.
  Result<Layout> make(int64_t num_layers) const { return values().make(num_layers); }
};

// --no-verify: skip the check of SRC by its format's own checks before the output is committed.
inline void add_no_verify_flag(CLI::App& sub, bool& no_verify) {
  sub.add_flag("--no-verify", no_verify,
               "Skip checking SRC before committing the output (piece digests of a native store, zip CRC-32 of torch files; "
               "formats without checksums, such as safetensors, are read but cannot be checked)");
}

struct StreamFlags {
  int threads = 2;
  std::string max_memory = "256M";

  void add(CLI::App& sub);
  // The executor chunk size that keeps its buffers within --max-memory less `reserve` bytes (kept
  // for a writer's own buffers: HDF5, hashing), for the widest source / narrowest output element.
  Result<uint64_t> chunk_bytes(size_t max_src_elem, size_t min_out_elem, uint64_t reserve = 0) const;
  // The same, for copying `src`'s pieces into `out` pieces (widest source, narrowest output element).
  Result<uint64_t> chunk_bytes_for(const TensorSource& src, const std::vector<Piece>& out) const;
  // On stderr: the note of a job that ran below its memory floor (converters/jobs/memory_fit.h).
  void print_memory_note(const MemoryFit& fit) const;
};

// --io direct|buffered|auto (formats/io/output_file.h).
struct IoFlags {
  std::string io = "auto";

  void add(CLI::App& sub);
  Result<IoMode> mode() const { return parse_io_mode(io, "--io"); }
};

}  // namespace ckpt::cli
