// WritePool: the large aligned buffers of a job's direct writes and the threads that write them,
// shared by the OutputFiles of the job (OutputFile::set_write_pool, formats/io/output_file.h), so
// that several large requests are in flight at once, from one file or from several.
//
// Why: the disk of the development machine (shared, virtual) gives its bandwidth to large requests
// with several in flight: `dd oflag=direct` of 3.08 GB took 3.23 s in 4 MiB requests, 2.26 s in
// 32 MiB ones and 1.79 s as two writers of 16 MiB (LIMITS.md). Writes of 2 MiB one at a time per
// file, one file after another, got half of that.
//
// Contract:
//  - `buffers` buffers of request_bytes() each (IoBuffer: mapped, page-aligned), allocated on first
//    use and kept; memory() = buffers x request_bytes is all the pool ever holds.
//  - acquire(): a free buffer, waiting while every buffer is held (filled by a caller, queued or
//    being written). A caller holds at most one acquired buffer while it waits in acquire(): every
//    other buffer is then being written or filled by a caller that does not wait, so acquire()
//    always returns. Null when the memory cannot be had (the caller writes another way).
//  - submit(group, buf, bytes, write): runs `write` on a writer thread (one per buffer: every filled
//    buffer is in flight at once), then `buf` is free again; `group` counts the write until it has
//    run and keeps the first error. A write that fails stays failed for its group.
//  - give_back(buf): an acquired buffer not submitted.
//  - Holders (add_holder): owners of buffers that wait for more bytes (WriteBlocks: a block whose
//    other copies have not come yet). When acquire() finds no free buffer and no write in flight,
//    no buffer would come back by itself: it asks the holders to write one of theirs as it is
//    (Holder::release_one), then waits for that write.
//  - WriteGroup::wait(): until every write submitted with the group has run; their first error.
//    WriteGroup::failed(): that error now, without waiting (OK while none).
//  - --io auto (set_auto): the pool chooses, per run, how its requests reach the disk, from what it
//    measures in the run's own first requests: the first buffered_probe_bytes() (two requests) go
//    through the page cache with their writeback waited for (sync_file_range: what the final fsync
//    would pay), alone in flight; the next probe_bytes() go direct, alone in flight with each other;
//    each probe's rate is its bytes over the time it had a request in flight; every later request goes
//    the faster way (choice()), buffered only when its probe was kBufferedMargin times faster. A
//    submit that would start the direct probe or pass it waits until the probe before it is done (the
//    copies keep filling buffers meanwhile). The buffered probe is small and first because it is the
//    slow one on this machine's disk (0.40-0.50 GB/s against direct 1.0-1.5 GB/s, 2026-11-28/29): a
//    128 MiB buffered probe after the direct one cost a 3.08 GB reshard 0.25 s of its 2.1 s; two
//    requests first cost ~0.05 s and need no drain before them. A buffered request of the run waits
//    for its writeback as the probe's did (OutputFile), so that the probe predicts the run: left to
//    the kernel's flusher and the final fsync, the dirty pages of a buffered run were written far
//    slower than the probe measured (3.34 GB MoE reshard, 2026-11-28: a probe at 0.98 GB/s buffered
//    vs 0.50 GB/s direct chose buffered, whose write then took 15.8 s; runs that chose direct
//    2.5-4 s); and the run's buffered requests are measured the same way: once probe_bytes() of them
//    are done, a cumulative rate below the direct probe's switches every later request to direct
//    (Choice::switched), the "switch when the observed rate of one falls below the other".
//    Without set_auto every request is kDirect (the file writes direct where it can). Bytes
//    are the same either way.
// Thread safety: every method from any thread; a WriteGroup must outlive its writes (wait() first).
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "formats/base/status.h"
#include "formats/io/io_buffer.h"

namespace ckpt {

class ThreadPool;

// Request size of the direct writes (bytes per buffer): dd oflag=direct of 3.08 GB on the
// development machine, 2026-11-28: 3.23 s in 4 MiB requests, 2.26 s in 32 MiB, 1.79 s as two
// writers of 16 MiB (LIMITS.md); converters/jobs/memory_fit.h fit_write_pool sizes the pool.
inline constexpr uint64_t kWriteRequestBytes = uint64_t{16} << 20;

class WriteGroup {
 public:
  WriteGroup() = default;
  WriteGroup(const WriteGroup&) = delete;
  WriteGroup& operator=(const WriteGroup&) = delete;
  ~WriteGroup() { (void)wait(); }
  Status wait();
  Status failed();

 private:
  friend class WritePool;
  void done(Status st);
  std::mutex mu_;
  std::condition_variable cv_;
  int pending_ = 0;
  Status first_;
};

class WritePool {
 public:
  static constexpr uint64_t kProbeBytes = uint64_t{64} << 20;
  static constexpr int kBufferedProbeRequests = 2;
  static constexpr double kBufferedMargin = 1.5;
  // `buffers` >= 1 buffers of `request_bytes` (rounded up to 4 KiB); `probe_bytes`: auto's direct
  // probe; its buffered probe is min(probe_bytes, kBufferedProbeRequests requests).
  WritePool(int buffers, uint64_t request_bytes = kWriteRequestBytes, uint64_t probe_bytes = kProbeBytes);
  ~WritePool();  // waits for the writes in flight
  WritePool(const WritePool&) = delete;
  WritePool& operator=(const WritePool&) = delete;

  uint64_t request_bytes() const { return request_; }
  int buffers() const { return nbuf_; }
  uint64_t memory() const { return static_cast<uint64_t>(nbuf_) * request_; }

  char* acquire();
  void give_back(char* buf);
  class Holder {
   public:
    // Writes (submits) or gives back one held buffer that no copy is filling; false: none.
    virtual bool release_one() = 0;

   protected:
    ~Holder() = default;
  };
  // A holder is asked from acquire() (never while it is removed: remove_holder waits for that).
  void add_holder(Holder* h);
  void remove_holder(Holder* h);
  // How one request is written: O_DIRECT (where the file allows), through the page cache, or
  // through the page cache with its writeback waited for (auto's probe).
  enum class Route { kDirect, kBuffered, kBufferedProbe };
  // `bytes`: what the write writes (counted in stats(); the probes' sizes).
  void submit(WriteGroup& group, char* buf, uint64_t bytes, std::function<Status(Route)> write);

  void set_auto(bool on);
  uint64_t probe_bytes() const { return probe_; }
  uint64_t buffered_probe_bytes() const { return bprobe_; }
  struct Choice {
    bool automatic = false;       // set_auto
    bool decided = false;         // both probes done
    Route route = Route::kDirect;  // of the requests after the probes (after a switch: kDirect)
    double direct_bytes_per_s = 0, buffered_bytes_per_s = 0;  // measured by the probes (0: not yet)
    // When buffered was chosen: the run's own buffered requests, measured as the probes were
    // (cumulative), and whether their rate fell below the direct probe's, after which every later
    // request went direct (at most one switch).
    double buffered_run_bytes_per_s = 0;
    bool switched = false;
  };
  Choice choice() const;

  struct Stats {
    uint64_t writes = 0, bytes = 0;  // submitted writes (bytes: as the caller counted them)
    uint64_t acquire_waits = 0;      // acquire() calls that waited for a buffer
    uint64_t allocated = 0;          // buffers allocated (never more than buffers())
    double write_seconds = 0;        // summed over the writes (several run at once)
    uint64_t partial_writes = 0;     // writes of fewer bytes than request_bytes()
    uint64_t holder_releases = 0;    // buffers holders wrote unfilled because acquire() found none free
  };
  Stats stats() const;

 private:
  const int nbuf_;
  const uint64_t request_, probe_, bprobe_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  struct Probe {
    uint64_t assigned = 0, done = 0;  // bytes
    int inflight = 0;
    double busy_since = 0, busy = 0;  // seconds with a request of it in flight (busy: closed spans)
    // Its bytes done over its time in flight up to `t`, the span still open included (a busy run's
    // requests overlap without a pause: busy alone would stay 0).
    double rate(double t) const { return static_cast<double>(done) / std::max(1e-9, busy + (inflight > 0 ? t - busy_since : 0)); }
  };
  enum ProbeIndex { kDirectProbe = 0, kBufferedProbeIndex = 1, kBufferedRun = 2, kNotProbed = -1 };
  // mu_ held; `probe`: the request's ProbeIndex.
  Route route_for(std::unique_lock<std::mutex>& l, uint64_t bytes, int& probe);
  void started(int probe, double t);
  void finished(int probe, double t, uint64_t bytes);
  bool auto_ = false;
  Probe probes_[3];  // by ProbeIndex
  Choice choice_;
  std::vector<IoBuffer> mem_;   // allocated lazily, up to nbuf_
  std::vector<char*> free_;
  int inflight_ = 0;  // submitted writes not finished
  Stats stats_;
  std::mutex holders_mu_;  // held while a holder is asked: remove_holder waits for it
  std::vector<Holder*> holders_;  // guarded by holders_mu_
  bool release_from_holders();
  std::unique_ptr<ThreadPool> writers_;  // one per buffer (its threads start with the first submit())
};

}  // namespace ckpt
