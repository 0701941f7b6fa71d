#include "formats/io/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <optional>

#include "formats/base/file_io.h"
#include "formats/base/thread_pool.h"
#include "formats/io/held_blocks.h"
#include "formats/io/io_buffer.h"
#include "formats/io/source_blocks.h"
#include "formats/io/source_window.h"

namespace ckpt {

namespace {

constexpr uint64_t kStageBytes = 4ull << 20;       // staging buffer per writing thread
constexpr uint64_t kGatherWindowBytes = 8ull << 20;  // source bytes mapped at a time, all source files together
static_assert(kCopyThreadBytes >= kStageBytes + kGatherWindowBytes + kSourceBufferCacheBytes, "kCopyThreadBytes: a copying thread's buffers");
static_assert(kCopyThreadReadAheadBytes >= kStageBytes, "kCopyThreadReadAheadBytes: a copying thread's stage");

uint64_t dio_round_down(uint64_t x) { return x / kDirectAlignBytes * kDirectAlignBytes; }
uint64_t dio_round_up(uint64_t x) { return dio_round_down(x + kDirectAlignBytes - 1); }

// The calling thread's staging buffer (aligned for O_DIRECT; allocated once, reused).
// A mapped buffer (formats/io/io_buffer.h): freed with the thread, it leaves no malloc arena behind.
char* dio_stage() {
  thread_local IoBuffer buf;
  if (!buf.data()) buf = IoBuffer(kStageBytes);
  return buf.data();
}

// copy_runs' writes run here while the copying thread fills its other half stage; the jobs only
// write (never wait on other jobs), so every queued job finishes.
ThreadPool& dio_write_pool() {
  static ThreadPool pool(8);
  return pool;
}

Status dio_short_source(const FileExtent& r, uint64_t size, const std::string& path) {
  return Status::Error("ShortSource", "source file (" + std::to_string(size) + " bytes) ended before bytes [" + std::to_string(r.offset) +
                                          ", " + std::to_string(r.offset + r.bytes) + ") while copying to '" + path + "'");
}

}  // namespace

// Buffered writes + fsync vs O_DIRECT writes + fsync of new files, dd on the development machine
// (docs/BENCHMARKS.md "--io auto threshold"): at 4 MiB buffered is as fast or faster, from 16 MiB on direct is faster
// and the gap grows with the size (a fsync of many dirty pages).
const uint64_t kAutoDirectMinBytes = 16ull << 20;

const char* io_flag_help() {
  return "how data files are written, and the source ranges copied into them read: direct (O_DIRECT, around the page "
         "cache; falls back to buffered where the file system refuses it), buffered (through the page cache) or auto "
         "(direct writes for files of 16 MiB or more; sources mostly in the page cache read through it, others direct "
         "with read-ahead; default). The output bytes are the same in every mode";
}

Result<IoMode> parse_io_mode(const std::string& spec, const std::string& flag) {
  if (spec == "auto") return IoMode::kAuto;
  if (spec == "buffered") return IoMode::kBuffered;
  if (spec == "direct") return IoMode::kDirect;
  return Status::InvalidArgument(flag + " '" + spec + "': expected direct, buffered or auto");
}

const char* io_mode_name(IoMode m) {
  switch (m) {
    case IoMode::kAuto: return "auto";
    case IoMode::kBuffered: return "buffered";
    case IoMode::kDirect: return "direct";
  }
  return "?";
}

IoMode resolve_io_mode(IoMode m, uint64_t file_bytes) {
  if (m != IoMode::kAuto) return m;
  return file_bytes >= kAutoDirectMinBytes ? IoMode::kDirect : IoMode::kBuffered;
}

Result<OutputFile> OutputFile::open(const std::string& path, int flags, IoMode mode, uint64_t file_bytes) {
  OutputFile f;
  f.st_ = std::make_unique<State>();
  f.st_->path = path;
  CKPT_ASSIGN_OR_RETURN(f.st_->fd, open_fd(path, flags, "cannot open for writing"));
  // Sources of copy_runs are read direct with --io direct, or where a SourceBlocks is given
  // (set_read_ahead: --io auto from a cold source too); direct windows alone (4 MiB, one read
  // ahead) measured 1.6-2.3x slower than mapped reads with the kernel's read-ahead on this VM
  // (docs/BENCHMARKS.md "--io modes"), so auto without a SourceBlocks reads through the page cache.
  f.st_->read_io = mode == IoMode::kDirect ? IoMode::kDirect : IoMode::kBuffered;
  if (resolve_io_mode(mode, file_bytes) == IoMode::kDirect) {
    // The same file again, around the page cache; refused (EINVAL on tmpfs of old kernels,
    // overlayfs, FUSE): buffered writes only.
    int d = ::open(path.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
    if (d >= 0) {
      f.st_->dfd = ScopedFd(d);
      f.st_->direct.store(true);
    }
  }
  return f;
}

OutputFile OutputFile::adopt(ScopedFd fd, std::string path) {
  OutputFile f;
  f.st_ = std::make_unique<State>();
  f.st_->fd = std::move(fd);
  f.st_->path = std::move(path);
  return f;
}

Status OutputFile::gather_ranges(std::vector<ByteRange> ranges) {
  if (!st_->pool || !st_->direct.load()) return Status::Ok();  // nothing to gather: each write goes out as it comes
  State* st = st_.get();
  CKPT_ASSIGN_OR_RETURN(st_->blocks, WriteBlocks::create(*st_->pool, st_->writes, std::move(ranges),
                                                         [st](WritePool::Route r, const char* buf, uint64_t base, const std::vector<ByteRange>& rs) {
                                                           return write_request(*st, r, buf, base, rs);
                                                         },
                                                         st_->path));
  return Status::Ok();
}

Status OutputFile::wait() const {
  if (!st_) return Status::Ok();
  Status f = st_->blocks ? st_->blocks->flush() : Status::Ok();  // blocks still gathering go out as they are
  Status w = st_->writes.wait();
  return f.ok() ? w : f;
}

Status OutputFile::close() {
  if (!st_) return Status::Ok();
  Status w = wait();  // gathered blocks and the writes still in flight
  Status a = st_->dfd.valid() ? st_->dfd.close(st_->path) : Status::Ok();
  Status b = st_->fd.valid() ? st_->fd.close(st_->path) : Status::Ok();
  return !w.ok() ? w : a.ok() ? b : a;
}

void OutputFile::reset() { st_.reset(); }

// `n` and `off` multiples of the alignment, `p` aligned: O_DIRECT; EINVAL: buffered from now on.
Status OutputFile::write_direct(State& st, const char* p, uint64_t n, uint64_t off) {
  while (n > 0 && st.direct.load()) {
    ssize_t r = ::pwrite(st.dfd.get(), p, static_cast<size_t>(std::min<uint64_t>(n, 1u << 30)), static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EINVAL || errno == EOPNOTSUPP)) {
      st.direct.store(false);  // refused: the rest of this file goes through the page cache
      break;
    }
    if (r < 0) return Status::FromErrno("direct write failed", st.path, errno);
    p += r;
    off += static_cast<uint64_t>(r);
    n -= static_cast<uint64_t>(r);
  }
  return n > 0 ? pwrite_full(st.fd.get(), p, n, off, st.path) : Status::Ok();
}

// Writes bytes [a, b) of the file from `stage`, whose byte 0 is file offset `base` (aligned).
Status OutputFile::write_staged(State& st, const char* stage, uint64_t base, uint64_t a, uint64_t b) {
  const uint64_t a_up = dio_round_up(a), b_down = dio_round_down(b);
  if (!st.direct.load() || a_up >= b_down) return pwrite_full(st.fd.get(), stage + (a - base), b - a, a, st.path);
  if (a_up > a) CKPT_RETURN_IF_ERROR(pwrite_full(st.fd.get(), stage + (a - base), a_up - a, a, st.path));
  CKPT_RETURN_IF_ERROR(write_direct(st, stage + (a_up - base), b_down - a_up, a_up));
  if (b > b_down) CKPT_RETURN_IF_ERROR(pwrite_full(st.fd.get(), stage + (b_down - base), b - b_down, b_down, st.path));
  return Status::Ok();
}

// A pool request: each range's aligned middle direct (write_staged), or through the page cache
// with its writeback waited for (auto's buffered probe and run: as the probe measured it, so that
// the run goes at the probe's rate instead of leaving the dirty pages to the kernel's flusher and
// the fsync).
Status OutputFile::write_request(State& st, WritePool::Route route, const char* buf, uint64_t base, const std::vector<ByteRange>& ranges) {
  for (const ByteRange& r : ranges) {
    if (route == WritePool::Route::kDirect) {
      CKPT_RETURN_IF_ERROR(write_staged(st, buf, base, r.begin, r.end));
      continue;
    }
    CKPT_RETURN_IF_ERROR(pwrite_full(st.fd.get(), buf + (r.begin - base), r.end - r.begin, r.begin, st.path));
    if (::sync_file_range(st.fd.get(), static_cast<off_t>(r.begin), static_cast<off_t>(r.end - r.begin),
                          SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER) != 0)
      return Status::FromErrno("writeback failed", st.path, errno);
  }
  return Status::Ok();
}

// Where copy_runs gathers the file bytes [flushed, filled) (byte 0 of the buffer is file offset
// `base`, aligned): inside the file's gathered ranges (`gather`: gather_ranges), a slice of one
// block after another of WriteBlocks, handed back as it fills (the block goes out once every copy
// into it is done); else with a WritePool, one of its buffers, submitted to the pool when full (the
// next acquired meanwhile), the last one at finish(); else the thread's stage in two halves, one
// filled while the other is written on dio_write_pool (a copy takes max(copy, write)). `each`
// sees every byte once, in order, before it is written.
class OutputFile::Stage {
 public:
  using Each = std::function<void(const void*, size_t)>;
  Stage(State& st, uint64_t off, const Each& each, WriteBlocks* gather = nullptr)
      : st_(st), each_(each), gather_(gather), base_(dio_round_down(off)), filled_(off), flushed_(off) {}
  ~Stage() {
    if (gather_ && buf_) (void)gather_->fill(slice_, 0);  // an error ended the copy: the slice dropped
    else if (st_.pool) st_.pool->give_back(buf_);  // not submitted: an error ended the copy
    if (pending_.valid()) (void)pending_.get();
  }
  Status init() {
    if (gather_) return st_.writes.failed();  // the first slice at refill()
    if (st_.pool) {
      CKPT_RETURN_IF_ERROR(st_.writes.failed());  // an earlier write of this file failed
      buf_ = st_.pool->acquire();
      cap_ = st_.pool->request_bytes();
    } else {
      halves_[0] = dio_stage();
      halves_[1] = halves_[0] ? halves_[0] + kStageBytes / 2 : nullptr;
      buf_ = halves_[0];
      cap_ = kStageBytes / 2;
    }
    if (!buf_)
      return Status::Io("cannot allocate a " + std::to_string(std::max(cap_, kStageBytes) >> 20) + " MiB staging buffer writing '" + st_.path +
                        "'");
    return Status::Ok();
  }
  // After a full pool buffer went out, the next is acquired here: the caller holds no source block
  // while it may wait for one (HeldBlocks: no wait for a buffer while holding a block, nor the reverse).
  bool has_buffer() const { return buf_ != nullptr; }
  Status refill() {
    CKPT_RETURN_IF_ERROR(st_.writes.failed());
    if (gather_) {
      CKPT_ASSIGN_OR_RETURN(slice_, gather_->open(filled_));
      buf_ = slice_.p;
      base_ = slice_.off;
      cap_ = slice_.n;
      return Status::Ok();
    }
    if (!(buf_ = st_.pool->acquire())) return Status::Io("cannot allocate a write buffer writing '" + st_.path + "'");
    return Status::Ok();
  }
  char* at() const { return buf_ + (filled_ - base_); }
  uint64_t room() const { return cap_ - (filled_ - base_); }
  Status added(uint64_t k) {
    if (gather_) {
      if (each_) each_(at(), static_cast<size_t>(k));
      filled_ += k;
      return room() == 0 ? end_slice() : Status::Ok();
    }
    filled_ += k;
    return room() == 0 ? flush() : Status::Ok();
  }
  Status finish() {
    if (gather_) return buf_ ? end_slice() : Status::Ok();
    CKPT_RETURN_IF_ERROR(flush());
    return pending_.valid() ? pending_.get() : Status::Ok();
  }

 private:
  Status end_slice() {
    buf_ = nullptr;
    return gather_->fill(slice_, filled_ - slice_.off);
  }
  Status flush() {
    if (filled_ > flushed_) {
      if (each_) each_(buf_ + (flushed_ - base_), static_cast<size_t>(filled_ - flushed_));
      State* st = &st_;
      if (st_.pool) {
        st_.pool->submit(st_.writes, buf_, filled_ - flushed_, [st, b = buf_, base = base_, x = flushed_, y = filled_](WritePool::Route r) {
          return write_request(*st, r, b, base, {ByteRange{x, y}});
        });
        buf_ = nullptr;
      } else {
        if (pending_.valid()) CKPT_RETURN_IF_ERROR(pending_.get());  // the other half's write
        pending_ = dio_write_pool().submit([st, b = buf_, base = base_, x = flushed_, y = filled_] { return write_staged(*st, b, base, x, y); });
        buf_ = halves_[half_ ^= 1];
      }
      base_ = flushed_ = filled_;  // aligned after a full buffer; a last flush ends the call
    }
    return Status::Ok();
  }

  State& st_;
  const Each& each_;
  WriteBlocks* const gather_;
  WriteBlocks::Slice slice_;
  char* buf_ = nullptr;
  char* halves_[2] = {nullptr, nullptr};
  int half_ = 0;
  uint64_t cap_ = 0, base_, filled_, flushed_;
  std::future<Status> pending_;  // the half being written (no pool)
};

// Copies [p, p + n) into the pool's buffers at file offset `off`, written while the caller goes on.
Status OutputFile::write_pooled(State& st, const char* p, uint64_t n, uint64_t off) {
  const Stage::Each none;
  Stage stage(st, off, none);
  CKPT_RETURN_IF_ERROR(stage.init());
  for (uint64_t done = 0; done < n;) {
    if (!stage.has_buffer()) CKPT_RETURN_IF_ERROR(stage.refill());
    const uint64_t k = std::min(stage.room(), n - done);
    std::memcpy(stage.at(), p + done, k);
    done += k;
    CKPT_RETURN_IF_ERROR(stage.added(k));
  }
  return stage.finish();
}

// Inside the gathered ranges a write from memory goes out as it would without them (its aligned
// middle straight from the caller's memory) and is counted in its blocks (WriteBlocks::external):
// copied into them instead, a trainer's save touched every page of the pool's buffers (+30-42 MiB
// of RSS per rank in test_trainer_memory, beyond the estimate its memory check relies on).
Status OutputFile::write(const void* src, uint64_t n, uint64_t off) const {
  State& st = *st_;
  if (n == 0) return Status::Ok();
  if (!st.blocks) return write_now(st, static_cast<const char*>(src), n, off);
  CKPT_ASSIGN_OR_RETURN(const bool counted, st.blocks->gathers(off, n, "write"));
  CKPT_RETURN_IF_ERROR(write_now(st, static_cast<const char*>(src), n, off));
  return counted ? st.blocks->external(off, n) : Status::Ok();
}

Status OutputFile::write_now(State& st, const char* p, uint64_t n, uint64_t off) {
  if (!st.direct.load() || n < kDirectAlignBytes) return pwrite_full(st.fd.get(), p, n, off, st.path);
  const uint64_t a_up = dio_round_up(off), b_down = dio_round_down(off + n);
  if (reinterpret_cast<uintptr_t>(p) % kDirectAlignBytes == off % kDirectAlignBytes && a_up < b_down) {
    // `src` sits at the file offset's phase: its aligned middle goes out as it is, no staging copy.
    if (a_up > off) CKPT_RETURN_IF_ERROR(pwrite_full(st.fd.get(), p, a_up - off, off, st.path));
    CKPT_RETURN_IF_ERROR(write_direct(st, p + (a_up - off), b_down - a_up, a_up));
    const uint64_t end = off + n;
    return end > b_down ? pwrite_full(st.fd.get(), p + (b_down - off), end - b_down, b_down, st.path) : Status::Ok();
  }
  if (st.pool) return write_pooled(st, p, n, off);  // in the pool's large buffers, written while the caller goes on
  char* stage = dio_stage();
  if (!stage) return pwrite_full(st.fd.get(), p, n, off, st.path);
  for (uint64_t cur = off, end = off + n; cur < end;) {
    const uint64_t base = dio_round_down(cur), k = std::min(kStageBytes - (cur - base), end - cur);
    std::memcpy(stage + (cur - base), p + (cur - off), k);
    CKPT_RETURN_IF_ERROR(write_staged(st, stage, base, cur, cur + k));
    cur += k;
  }
  return Status::Ok();
}

Status OutputFile::copy_runs(const std::vector<FileExtent>& runs, uint64_t off,
                             const std::function<void(const void*, size_t)>& each_block) const {
  if (runs.size() == 1 && !st_->direct.load() && st_->read_io == IoMode::kBuffered && !st_->pool)
    return copy_file_bytes(runs[0].fd, runs[0].offset, st_->fd.get(), off, runs[0].bytes, st_->path, each_block);
  WriteBlocks* gather = nullptr;
  if (st_->blocks) {
    uint64_t total = 0;
    for (const FileExtent& r : runs) total += r.bytes;
    CKPT_ASSIGN_OR_RETURN(const bool inside, st_->blocks->gathers(off, total, "copy"));
    if (inside) gather = st_->blocks.get();
  }
  Stage stage(*st_, off, each_block, gather);
  CKPT_RETURN_IF_ERROR(stage.init());
  std::vector<int> fds;  // distinct source files: their windows share kGatherWindowBytes
  for (const FileExtent& r : runs)
    if (fds.size() < 64 && std::find(fds.begin(), fds.end(), r.fd) == fds.end()) fds.push_back(r.fd);
  // Mapped windows count in RSS, as do direct ones (two per source: one read ahead): the same total.
  uint64_t window = std::max<uint64_t>(1 << 20, kGatherWindowBytes / std::max<size_t>(1, fds.size()));
  if (st_->read_io != IoMode::kBuffered) window /= 2;
  std::deque<SourceWindow> wins;  // one per source file (a deque: never moved)
  auto end_of = [&runs](int fd) {  // the last byte needed from `fd`: no read-ahead past it
    uint64_t e = 0;
    for (const FileExtent& x : runs) e = x.fd == fd ? std::max(e, x.offset + x.bytes) : e;
    return e;
  };
  SourceBlocks* blocks = st_->read_io == IoMode::kDirect ? st_->read_ahead : nullptr;
  std::optional<HeldBlocks> held;
  if (blocks) held.emplace(*blocks);
  for (const FileExtent& r : runs) {
    uint64_t done = 0;
    while (held && done < r.bytes) {  // direct reads with the read-ahead of SourceBlocks
      if (!stage.has_buffer()) {
        held->release_all();
        CKPT_RETURN_IF_ERROR(stage.refill());
      }
      CKPT_ASSIGN_OR_RETURN(HeldBlocks::Held* const h, held->get(r.fd, r.offset + done, r.bytes - done, st_->path));
      if (!h) break;  // not direct-readable: the windows below
      const uint64_t in = r.offset + done - h->off;
      const uint64_t k = std::min({r.bytes - done, stage.room(), h->ls.n - in});
      std::memcpy(stage.at(), h->ls.p + in, k);
      h->used += k;
      done += k;
      CKPT_RETURN_IF_ERROR(stage.added(k));
    }
    if (done == r.bytes) continue;
    auto w = std::find_if(wins.begin(), wins.end(), [&r](const SourceWindow& x) { return x.fd() == r.fd; });
    if (w == wins.end()) {
      wins.emplace_back(r.fd, st_->read_io, window, end_of(r.fd));
      w = wins.end() - 1;
      CKPT_RETURN_IF_ERROR(w->init(st_->path));
    }
    if (r.offset > w->file_size() || w->file_size() - r.offset < r.bytes) return dio_short_source(r, w->file_size(), st_->path);
    while (done < r.bytes) {
      if (!stage.has_buffer()) {
        if (held) held->release_all();
        CKPT_RETURN_IF_ERROR(stage.refill());
      }
      uint64_t k = std::min(r.bytes - done, stage.room());
      CKPT_ASSIGN_OR_RETURN(const SourceWindow::Span sp, w->at(r.offset + done, k, st_->path));
      if (!sp.p) {
        CKPT_RETURN_IF_ERROR(pread_full(r.fd, stage.at(), k, r.offset + done, "a source of '" + st_->path + "'"));
      } else if (w->last_was_direct()) {
        std::memcpy(stage.at(), sp.p, k = sp.n);
      } else if (!copy_from_mapping(stage.at(), sp.p, k = sp.n)) {
        return Status::Error("ShortSource", "source file shrank while copying to '" + st_->path + "'");
      }
      done += k;
      CKPT_RETURN_IF_ERROR(stage.added(k));
    }
  }
  if (held) held->release_all();
  return stage.finish();
}

}  // namespace ckpt
