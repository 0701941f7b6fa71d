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

#include "formats/base/file_io.h"
#include "formats/base/thread_pool.h"
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

// The write of one half stage in flight; waited for before the half is filled again, and on
// every way out of copy_runs (the stage is the thread's: never left in use).
class PendingWrite {
 public:
  ~PendingWrite() { (void)wait(); }
  void start(std::future<Status> f) { f_ = std::move(f); }
  Status wait() { return f_.valid() ? f_.get() : Status::Ok(); }

 private:
  std::future<Status> f_;
};

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

Status OutputFile::close() {
  if (!st_) return Status::Ok();
  Status a = st_->dfd.valid() ? st_->dfd.close(st_->path) : Status::Ok();
  Status b = st_->fd.valid() ? st_->fd.close(st_->path) : Status::Ok();
  return a.ok() ? b : a;
}

void OutputFile::reset() { st_.reset(); }

// `n` and `off` multiples of the alignment, `p` aligned: O_DIRECT; EINVAL: buffered from now on.
Status OutputFile::write_direct(const char* p, uint64_t n, uint64_t off) const {
  while (n > 0 && st_->direct.load()) {
    ssize_t r = ::pwrite(st_->dfd.get(), p, static_cast<size_t>(std::min<uint64_t>(n, 1u << 30)), static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EINVAL || errno == EOPNOTSUPP)) {
      st_->direct.store(false);  // refused: the rest of this file goes through the page cache
      break;
    }
    if (r < 0) return Status::FromErrno("direct write failed", st_->path, errno);
    p += r;
    off += static_cast<uint64_t>(r);
    n -= static_cast<uint64_t>(r);
  }
  return n > 0 ? pwrite_full(st_->fd.get(), p, n, off, st_->path) : Status::Ok();
}

// Writes bytes [a, b) of the file from `stage`, whose byte 0 is file offset `base` (aligned).
Status OutputFile::write_staged(const char* stage, uint64_t base, uint64_t a, uint64_t b) const {
  const uint64_t a_up = dio_round_up(a), b_down = dio_round_down(b);
  if (!st_->direct.load() || a_up >= b_down) return pwrite_full(st_->fd.get(), stage + (a - base), b - a, a, st_->path);
  if (a_up > a) CKPT_RETURN_IF_ERROR(pwrite_full(st_->fd.get(), stage + (a - base), a_up - a, a, st_->path));
  CKPT_RETURN_IF_ERROR(write_direct(stage + (a_up - base), b_down - a_up, a_up));
  if (b > b_down) CKPT_RETURN_IF_ERROR(pwrite_full(st_->fd.get(), stage + (b_down - base), b - b_down, b_down, st_->path));
  return Status::Ok();
}

Status OutputFile::write(const void* src, uint64_t n, uint64_t off) const {
  if (!st_->direct.load() || n < kDirectAlignBytes) return pwrite_full(st_->fd.get(), src, n, off, st_->path);
  const char* p = static_cast<const char*>(src);
  const uint64_t a_up = dio_round_up(off), b_down = dio_round_down(off + n);
  if (reinterpret_cast<uintptr_t>(p) % kDirectAlignBytes == off % kDirectAlignBytes && a_up < b_down) {
    // `src` sits at the file offset's phase: its aligned middle goes out as it is, no staging copy.
    if (a_up > off) CKPT_RETURN_IF_ERROR(pwrite_full(st_->fd.get(), p, a_up - off, off, st_->path));
    CKPT_RETURN_IF_ERROR(write_direct(p + (a_up - off), b_down - a_up, a_up));
    const uint64_t end = off + n;
    return end > b_down ? pwrite_full(st_->fd.get(), p + (b_down - off), end - b_down, b_down, st_->path) : Status::Ok();
  }
  char* stage = dio_stage();
  if (!stage) return pwrite_full(st_->fd.get(), src, n, off, st_->path);
  for (uint64_t cur = off, end = off + n; cur < end;) {
    const uint64_t base = dio_round_down(cur), k = std::min(kStageBytes - (cur - base), end - cur);
    std::memcpy(stage + (cur - base), p + (cur - off), k);
    CKPT_RETURN_IF_ERROR(write_staged(stage, base, cur, cur + k));
    cur += k;
  }
  return Status::Ok();
}

// The stage is two halves: one is filled from the sources (and hashed, `each_block`) while the
// other is written on dio_write_pool, so a copy takes max(copy, write), not their sum (to-hf of a
// 3.08 GB rank, hot page cache: the copies added ~0.5 s to the ~3.1 s of the direct writes).
Status OutputFile::copy_runs(const std::vector<FileExtent>& runs, uint64_t off,
                             const std::function<void(const void*, size_t)>& each_block) const {
  if (runs.size() == 1 && !st_->direct.load() && st_->read_io == IoMode::kBuffered)
    return copy_file_bytes(runs[0].fd, runs[0].offset, st_->fd.get(), off, runs[0].bytes, st_->path, each_block);
  char* stages[2] = {dio_stage(), nullptr};
  if (!stages[0]) return Status::Io("cannot allocate a " + std::to_string(kStageBytes >> 20) + " MiB staging buffer writing '" + st_->path + "'");
  constexpr uint64_t kHalf = kStageBytes / 2;
  stages[1] = stages[0] + kHalf;
  size_t nsrc = 0;  // distinct source files: their windows share kGatherWindowBytes
  for (size_t i = 0; i < runs.size() && nsrc < 64; ++i)
    if (std::none_of(runs.begin(), runs.begin() + static_cast<long>(i), [&](const FileExtent& x) { return x.fd == runs[i].fd; })) ++nsrc;
  // Mapped windows count in RSS, as do direct ones (two per source: one read ahead): the same total.
  uint64_t window = std::max<uint64_t>(1 << 20, kGatherWindowBytes / std::max<size_t>(1, nsrc));
  if (st_->read_io != IoMode::kBuffered) window /= 2;
  std::deque<SourceWindow> wins;  // one per source file (a deque: never moved)
  auto end_of = [&runs](int fd) {  // the last byte needed from `fd`: no read-ahead past it
    uint64_t e = 0;
    for (const FileExtent& x : runs) e = x.fd == fd ? std::max(e, x.offset + x.bytes) : e;
    return e;
  };
  PendingWrite pending;  // declared after `wins`: gone first, so it is waited for first
  int half = 0;
  char* stage = stages[0];
  uint64_t base = dio_round_down(off), filled = off;  // stage holds file bytes [flushed, filled)
  uint64_t flushed = off;
  auto flush = [&]() -> Status {
    if (filled == flushed) return Status::Ok();
    if (each_block) each_block(stage + (flushed - base), static_cast<size_t>(filled - flushed));
    CKPT_RETURN_IF_ERROR(pending.wait());  // the other half's write
    pending.start(dio_write_pool().submit([this, stage, base, a = flushed, b = filled] { return write_staged(stage, base, a, b); }));
    base = flushed = filled;  // aligned after a full half; a final flush ends the call
    stage = stages[half ^= 1];
    return Status::Ok();
  };
  SourceBlocks* blocks = st_->read_io == IoMode::kDirect ? st_->read_ahead : nullptr;
  for (const FileExtent& r : runs) {
    uint64_t done = 0;
    while (blocks && done < r.bytes) {  // direct reads with the read-ahead of SourceBlocks
      CKPT_ASSIGN_OR_RETURN(const SourceBlocks::Lease ls, blocks->get(r.fd, r.offset + done, r.bytes - done, UINT64_MAX, st_->path));
      if (!ls.p) break;  // not direct-readable: the windows below
      const uint64_t k = std::min({r.bytes - done, kHalf - (filled - base), ls.n});
      std::memcpy(stage + (filled - base), ls.p, k);
      blocks->release(ls, k);
      filled += k;
      done += k;
      if (filled - base == kHalf) CKPT_RETURN_IF_ERROR(flush());
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
      uint64_t k = std::min(r.bytes - done, kHalf - (filled - base));
      CKPT_ASSIGN_OR_RETURN(const SourceWindow::Span sp, w->at(r.offset + done, k, st_->path));
      if (!sp.p) {
        CKPT_RETURN_IF_ERROR(pread_full(r.fd, stage + (filled - base), k, r.offset + done, "a source of '" + st_->path + "'"));
      } else if (w->last_was_direct()) {
        std::memcpy(stage + (filled - base), sp.p, k = sp.n);
      } else if (!copy_from_mapping(stage + (filled - base), sp.p, k = sp.n)) {
        return Status::Error("ShortSource", "source file shrank while copying to '" + st_->path + "'");
      }
      filled += k;
      done += k;
      if (filled - base == kHalf) CKPT_RETURN_IF_ERROR(flush());
    }
  }
  CKPT_RETURN_IF_ERROR(flush());
  return pending.wait();
}

}  // namespace ckpt
