// Flags shared by the commands that stream tensors and write checkpoints (reshard, from-hf,
// to-hf): the target layout (--tp --pp --pp-layers --dp --zero), the buffer budget and threads
// (--max-memory --threads) and how data files are written (--io). Each struct adds its options
// to a subcommand and parses their text once into the typed values of the job requests
// (converters/jobs/job_flags.h); errors are kInvalidArgument naming the flag.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "converters/jobs/job_flags.h"  // parse_max_memory, parse_store_flags, float_dtype_flag, ...
#include "converters/jobs/memory_fit.h"
#include "formats/base/status.h"
#include "formats/io/output_file.h"
#include "reshard/layout/layout_values.h"

namespace ckpt::cli {

struct LayoutFlags {
  int tp = 0, pp = 0, dp = 0, zero = -1, ep = 0, etp = 0;
  std::string pp_layers;

  void add(CLI::App& sub, const std::string& zero_help);
  bool given() const { return tp || pp || dp || zero >= 0 || ep || etp || !pp_layers.empty(); }
  // The values with --pp-layers parsed (errors name it).
  Result<LayoutValues> values() const {
    CKPT_ASSIGN_OR_RETURN(LayoutValues v, LayoutValues::parse(tp, pp, dp, zero, pp_layers));
    v.ep = ep;
    v.etp = etp;
    return v;
  }
};

// --no-verify: skip the check of SRC by its format's own checks before the output is committed.
inline void add_no_verify_flag(CLI::App& sub, bool& no_verify) {
  sub.add_flag("--no-verify", no_verify,
               "Skip checking SRC before committing the output (piece digests of a native store, zip CRC-32 of torch files; "
               "formats without checksums, such as safetensors, are read but cannot be checked)");
}

// --source-profile NAME: SRC's tensors are stored in that built-in profile (an HF or PaddleNLP
// directory, a .safetensors or .pdparams file; converters/source/open_checkpoint.h
// open_checkpoint_in_profile). PaddleNLP directories are detected without it.
inline void add_source_profile_flag(CLI::App& sub, std::string& profile, const std::string& name = "--source-profile") {
  sub.add_option(name, profile,
                 "the profile SRC's tensors are stored in (paddlenlp, paddlenlp-fused, megatron-mcore, ...; docs/PROFILES.md): names, "
                 "packing and orientation read back to HF's, U16 read as bf16 when config.json says \"dtype\": \"bfloat16\" "
                 "(default: detected; PaddleNLP directories are)");
}

struct StreamFlags {
  int threads = 2;
  std::string max_memory = "256M";

  void add(CLI::App& sub);
  // --max-memory in bytes (errors name the flag).
  Result<uint64_t> max_memory_bytes() const { return parse_max_memory(max_memory); }
  // On stderr: the note of a job that ran below its memory floor (converters/jobs/memory_fit.h).
  void print_memory_note(const MemoryFit& fit) const;
};

// --io direct|buffered|auto (formats/io/output_file.h).
struct IoFlags {
  std::string io = "auto";

  void add(CLI::App& sub);
  Result<IoMode> mode() const { return parse_io_flag(io); }
};

// The flags of a job that writes a new checkpoint from SRC: --max-memory --threads, --io, --no-fsync,
// --no-verify; fill() copies them into a request with the fields of that name (errors name the flag).
struct WriteFlags {
  StreamFlags stream;
  IoFlags io;
  bool no_fsync = false, no_verify = false;

  void add(CLI::App& sub) {
    stream.add(sub);
    io.add(sub);
    sub.add_flag("--no-fsync", no_fsync, "skip fsync (tests, benchmarks)");
    add_no_verify_flag(sub, no_verify);
  }
  template <class Request>
  Status fill(Request& req) const {
    CKPT_ASSIGN_OR_RETURN(req.max_memory, stream.max_memory_bytes());
    CKPT_ASSIGN_OR_RETURN(req.io, io.mode());
    req.threads = stream.threads;
    req.fsync = !no_fsync;
    req.no_verify = no_verify;
    return Status::Ok();
  }
};

}  // namespace ckpt::cli
