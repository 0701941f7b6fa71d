// The check `ckpt reshard` runs on a native-store SRC before it commits DST: every piece re-hashed
// against the manifest with the algorithm each piece records, xxh3-128 or sha256, manifest v1 or
// v2 (StoreReader::verify). verify_source_inline does it in this process;
// BackgroundVerify does it in a child process forked before this process touches SRC, so the
// hashing and its reads overlap the reshard on another core (HDF5 is not thread safe: a process,
// not a thread). The child's verdict comes back over a pipe as a Status (Status::to_json).
// The child never outlives its parent: it dies with it (PR_SET_PDEATHSIG) and the destructor
// kills and reaps a child still running.
// Thread safety: one object per thread; start() before this process starts other threads.
#pragma once

#include <sys/types.h>

#include <string>

#include "formats/status.h"
#include "formats/store/store_reader.h"

namespace ckpt {

// OK when every piece of `src` matches its digest; else the first failure, saying how many pieces
// fail and that nothing was committed.
Status verify_source_inline(store::StoreReader& src);

class BackgroundVerify {
 public:
  BackgroundVerify() = default;
  BackgroundVerify(const BackgroundVerify&) = delete;
  BackgroundVerify& operator=(const BackgroundVerify&) = delete;
  ~BackgroundVerify();

  // Forks the child that opens and verifies the store at `src_dir`, reading its pieces as `io`
  // says (StoreReader::set_read_io). False when pipe or fork fails (the caller then verifies inline).
  bool start(const std::string& src_dir, IoMode io = IoMode::kBuffered);
  bool started() const { return pid_ > 0; }
  pid_t child_pid() const { return pid_; }
  // Waits for the child and returns its verdict (kInternal if it died without one).
  Status wait();

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
};

}  // namespace ckpt
