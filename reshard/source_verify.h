// The mechanisms a job checks its SRC with before it commits (converters/source/source_check_job.h picks
// one): BackgroundVerify runs a check in a child process forked before this process touches SRC,
// so the hashing and its reads overlap the job on another core (HDF5 is not thread safe: a
// process, not a thread); the child's verdict comes back over a pipe as a Status
// (Status::to_json), and the child never outlives its parent (PR_SET_PDEATHSIG; the destructor
// kills and reaps a child still running). CopyVerify checks from the reads of the copy itself
// where the copy reads SRC with O_DIRECT through SourceBlocks: SRC is read once, not twice.
// verify_source_inline re-hashes a native store in this process; verdict() words any check's
// outcome as a job's.
// Thread safety: one object per thread; start() before this process starts other threads.
// CopyVerify::feed from any thread (SourceBlocks); finish() once, after the copies.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "formats/base/status.h"
#include "formats/digest/digest.h"
#include "formats/io/source_blocks.h"
#include "formats/store/store_reader.h"

namespace ckpt {

// OK when every piece of `src` matches its digest; else the first failure, saying how many pieces
// fail and that nothing was committed.
Status verify_source_inline(store::StoreReader& src);
// A check's outcome as a job's verdict on its SRC: OK, or the first failure saying how many units
// fail and that nothing was committed.
Status verdict(const CheckReport& rep);

// True when a store with manifest `m` can be checked by CopyVerify: every piece is stored
// uncompressed (compressed pieces are decoded, not copied from file ranges).
bool copy_verifiable(const store::Manifest& m);

// The source check as a BlockTap: the digest of every unit of `src` whose check is a digest of one
// file range (TensorSource::range_check: an uncompressed native piece, also through a canonical
// view) computed from the bytes the copy's direct reads bring in (SourceBlocks::set_tap). finish()
// takes the pieces whose unit's digest came out whole and equal, and checks the others (not read
// whole in order by the copy, stored compressed, or not matching: for the error that names them)
// with TensorSource::check_piece.
class CopyVerify final : public BlockTap {
 public:
  explicit CopyVerify(TensorSource& src);  // on the thread that owns `src`, before the copies
  std::vector<Range> ranges(uint64_t dev, uint64_t ino) override;
  void feed(uint64_t id, uint64_t off, const char* p, uint64_t n) override;
  // After the copies, on the thread that owns `src`: OK, or the failure as verdict() words it.
  Status finish();
  uint64_t bytes_from_copy() const { return from_copy_; }  // set by finish()
  uint64_t bytes_reread() const { return reread_; }        // set by finish()

 private:
  struct Hashed {
    uint64_t dev = 0, ino = 0, off = 0, bytes = 0;
    std::string want;  // expected hex digest
    std::mutex mu;
    uint64_t fed = 0;
    Digest digest;
    std::string hex;  // when fed == bytes
  };
  TensorSource& src_;
  std::vector<std::unique_ptr<Hashed>> hashed_;  // Range::id = index; one per distinct file range
  std::vector<int64_t> piece_range_;              // piece -> index into hashed_, -1: none
  uint64_t from_copy_ = 0, reread_ = 0;
};

class BackgroundVerify {
 public:
  BackgroundVerify() = default;
  BackgroundVerify(const BackgroundVerify&) = delete;
  BackgroundVerify& operator=(const BackgroundVerify&) = delete;
  ~BackgroundVerify();

  // Forks the child that opens and verifies the store at `src_dir`, reading its pieces as `io`
  // says (StoreReader::set_read_io). False when pipe or fork fails (the caller then verifies inline).
  bool start(const std::string& src_dir, IoMode io = IoMode::kBuffered);
  // Forks the child that runs `check` (which opens SRC itself, checks it and returns the verdict).
  // False, forking nothing, while a ThreadPool has workers (a fork would copy their locks).
  bool start(const std::function<Status()>& check);
  bool started() const { return pid_ > 0; }
  pid_t child_pid() const { return pid_; }
  // Waits for the child and returns its verdict (kInternal if it died without one).
  Status wait();

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
};

}  // namespace ckpt
