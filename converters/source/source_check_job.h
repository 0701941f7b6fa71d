// The check a job runs on its SRC before it commits anything (ARCHITECTURE.md "Integrity and
// I/O"): the format's own checks (TensorSource::check: a native store's piece digests and manifest
// checksum, torch zip entries' CRC-32; a format without any is not re-read, since the job reads every
// byte anyway, and the job's JSON says what cannot be checked, by format name). Used by to-hf, export-dcp, export-megatron, diff and the
// jobs built on reshard's executor (ExecOptions::before_commit): bytes from a corrupt SRC are
// never committed.
// The check runs in a child process forked before this process opens SRC, so that its reads and
// hashing overlap the job on another core (HDF5 is not thread safe: a process, not a thread);
// inline, on the job's own open source, when no child can be started. `--no-verify` skips it.
// Thread safety: one object per job; start() before the job starts threads.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "formats/base/io_mode.h"
#include "formats/base/status.h"
#include "formats/io/source_blocks.h"
#include "formats/tensor/tensor_io.h"
#include "reshard/source_verify.h"

namespace ckpt {

class JobSourceCheck {
 public:
  // Before SRC is opened by this process: forks the child that opens `src_path` (open_checkpoint)
  // and checks it, reading as `io` says; nothing when `skip` (--no-verify, --dry-run).
  // `in_child` false (under mpirun, where forking is unsafe): finish() checks inline.
  void start(const std::string& src_path, IoMode io, int threads, bool skip, bool in_child = true);
  // After the job's reads, before its commit: the child's verdict, or `src` checked inline when no
  // child runs. Also notes what `src` cannot check for to_json().
  Status finish(TensorSource& src);
  // A callable for ExecOptions::before_commit that finishes this check on `src`.
  std::function<Status()> before_commit(TensorSource& src) {
    return [this, &src] { return finish(src); };
  }
  // Checks from the copy's own direct reads instead (before the copies: `read_ahead` must be the
  // SourceBlocks they read through); finish() then takes CopyVerify's verdict. Call after start()
  // with in_child false.
  void from_copy(TensorSource& src, SourceBlocks& read_ahead);
  // {"how": "process" | "inline" | "copy" | "none", "scheme": what was checked, "note": what cannot be;
  //  copy: "bytes_from_copy", "bytes_reread"}.
  nlohmann::json to_json() const;

 private:
  bool skip_ = true;
  IoMode io_ = IoMode::kBuffered;
  int threads_ = 2;
  BackgroundVerify bg_;
  std::string how_ = "none";
  IntegrityInfo info_;
  std::shared_ptr<CopyVerify> tap_;
};

}  // namespace ckpt
