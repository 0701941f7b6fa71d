#include "formats/io/source_window.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <memory>
#include <vector>

#include "formats/base/file_io.h"
#include "formats/base/thread_pool.h"
#include "formats/io/io_buffer.h"

namespace ckpt {

namespace {

constexpr uint64_t kMaxSourceWindowBytes = 64ull << 20;

uint64_t srcwin_round_down(uint64_t x) { return x / kDirectAlignBytes * kDirectAlignBytes; }
uint64_t srcwin_round_up(uint64_t x) { return srcwin_round_down(x + kDirectAlignBytes - 1); }

// Direct-read buffers are reused (fresh pages cost 0.5-0.7 GB/s in an idle VM, LIMITS.md): a
// per-thread free list, by size. Mapped buffers (IoBuffer), not malloc's: formats/io/io_buffer.h.
struct SrcBufCache {
  std::vector<IoBuffer> free;
};
thread_local SrcBufCache t_src_bufs;

IoBuffer srcwin_buf_get(uint64_t bytes) {
  auto& f = t_src_bufs.free;
  for (size_t i = 0; i < f.size(); ++i)
    if (f[i].size() == bytes) {
      IoBuffer b = std::move(f[i]);
      f.erase(f.begin() + static_cast<long>(i));
      return b;
    }
  return IoBuffer(bytes);
}

void srcwin_buf_put(IoBuffer b) {
  if (!b.data()) return;
  auto& f = t_src_bufs.free;
  f.push_back(std::move(b));
  uint64_t kept = 0;
  for (const auto& x : f) kept += x.size();
  while (kept > kSourceBufferCacheBytes) {  // the oldest go first
    kept -= f.front().size();
    f.erase(f.begin());
  }
}

// The read-ahead threads: only preads run there (never waiting on other jobs), so a job queued
// behind others always finishes.
ThreadPool& srcwin_pool() {
  static ThreadPool pool(4);
  return pool;
}

// The parts of one window read at once (SourceWindow::read_direct); jobs never wait, so the
// read-ahead jobs waiting on them always finish.
constexpr uint64_t kSrcwinParts = 4, kSrcwinMinPartBytes = 512 << 10;
ThreadPool& srcwin_part_pool() {
  static ThreadPool pool(8);
  return pool;
}

// O_DIRECT reads of [base, base + len) into `p` (all aligned) until the end of the file;
// `*got`: the bytes read. EINVAL / EOPNOTSUPP: refused ("Unsupported", the caller falls back).
Status srcwin_pread_direct(int dfd, char* p, uint64_t base, uint64_t len, uint64_t* got, const std::string& what) {
  *got = 0;
  while (*got < len) {
    ssize_t r = ::pread(dfd, p + *got, static_cast<size_t>(len - *got), static_cast<off_t>(base + *got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EINVAL || errno == EOPNOTSUPP)) return Status::Unsupported("O_DIRECT read refused");
    if (r < 0) return Status::FromErrno("direct read failed (a source of)", what, errno);
    if (r == 0) break;
    *got += static_cast<uint64_t>(r);
    if (*got % kDirectAlignBytes != 0) break;  // the end of the file
  }
  return Status::Ok();
}

}  // namespace

// The window: a multiple of the O_DIRECT alignment and of the page size (mapped windows start on a page).
SourceWindow::SourceWindow(int fd, IoMode mode, uint64_t window, uint64_t end) : fd_(fd), mode_(mode), end_(end) {
  const uint64_t unit = std::max<uint64_t>(kDirectAlignBytes, static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)));
  window_ = std::clamp<uint64_t>(window, unit, kMaxSourceWindowBytes) / unit * unit;
}

SourceWindow::~SourceWindow() {
  (void)finish_read_ahead();
  drop_map();
  srcwin_buf_put(std::move(cur_.mem));
  srcwin_buf_put(std::move(next_.mem));
}

Status SourceWindow::init(const std::string& what) {
  what_ = what;
  struct stat sb {};
  if (::fstat(fd_, &sb) != 0) return Status::FromErrno("cannot stat a source of", what, errno);
  size_ = sb.st_size > 0 ? static_cast<uint64_t>(sb.st_size) : 0;
  regular_ = S_ISREG(sb.st_mode);
  unmappable_ = !regular_;
  if (mode_ == IoMode::kBuffered || !regular_) return Status::Ok();
  // A new open file description of the same file: O_DIRECT set on it leaves `fd_` as it is.
  int d = ::open(("/proc/self/fd/" + std::to_string(fd_)).c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (d < 0) return Status::Ok();  // refused: mapped windows
  dfd_ = ScopedFd(d);
  buf_bytes_ = window_;
  cur_.mem = srcwin_buf_get(buf_bytes_);
  next_.mem = srcwin_buf_get(buf_bytes_);
  cur_.p = cur_.mem.data();
  next_.p = next_.mem.data();
  if (!cur_.p || !next_.p) dfd_.reset();
  return Status::Ok();
}

void SourceWindow::drop_map() {
  if (map_) ::munmap(map_, map_len_);
  map_ = nullptr;
}

// Every page of [base, base + len) in the page cache (mincore of an unpopulated mapping).
bool SourceWindow::resident(uint64_t base, uint64_t len) const {
  if (len == 0) return true;
  void* m = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd_, static_cast<off_t>(base));
  if (m == MAP_FAILED) return false;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in((len + page - 1) / page);
  bool all = ::mincore(m, len, in.data()) == 0 && std::all_of(in.begin(), in.end(), [](unsigned char c) { return (c & 1) != 0; });
  ::munmap(m, len);
  return all;
}

SourceWindow::Span SourceWindow::map_window(uint64_t base, uint64_t off, uint64_t n) {
  drop_map();
  cur_direct_ = false;
  if (unmappable_) return {};
  map_base_ = base;
  map_len_ = std::min(window_, size_ - base);
  map_ = ::mmap(nullptr, map_len_, PROT_READ, MAP_SHARED | MAP_POPULATE, fd_, static_cast<off_t>(map_base_));
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    unmappable_ = true;
    return {};
  }
  // The next window is read ahead while this one is copied (and written).
  if (map_base_ + map_len_ < size_)
    (void)::posix_fadvise(fd_, static_cast<off_t>(map_base_ + map_len_), static_cast<off_t>(std::min(window_, size_ - map_base_ - map_len_)),
                          POSIX_FADV_WILLNEED);
  return {static_cast<const char*>(map_) + (off - base), std::min(n, map_base_ + map_len_ - off)};
}

// Queue depth matters: one 4 MiB O_DIRECT read at a time read a cold file at 0.37 GB/s here, four
// at once at 0.76 GB/s (the kernel's buffered read-ahead: 1.1 GB/s). So a window is read in up to
// kSrcwinParts aligned parts at once: the first on this thread, the others on srcwin_part_pool.
Status SourceWindow::read_direct(Buf& b, uint64_t base) {
  b.base = base;
  b.got = 0;
  const uint64_t len = std::min(buf_bytes_, srcwin_round_up(std::min(size_, end_)) - base);
  const uint64_t part = std::max<uint64_t>(kSrcwinMinPartBytes, srcwin_round_up((len + kSrcwinParts - 1) / kSrcwinParts));
  const size_t nparts = static_cast<size_t>((len + part - 1) / part);
  std::vector<uint64_t> got(nparts, 0);
  std::vector<std::future<Status>> rest;
  const int dfd = dfd_.get();
  for (size_t i = 1; i < nparts; ++i) {
    const uint64_t o = i * part, n = std::min(part, len - o);
    rest.push_back(srcwin_part_pool().submit([this, dfd, &b, &got, base, i, o, n] {
      return srcwin_pread_direct(dfd, b.p + o, base + o, n, &got[i], what_);
    }));
  }
  Status st = nparts > 0 ? srcwin_pread_direct(dfd, b.p, base, std::min(part, len), &got[0], what_) : Status::Ok();
  for (auto& f : rest) {
    Status s = f.get();
    if (st.ok() && !s.ok()) st = std::move(s);
  }
  for (size_t i = 0; i < nparts; ++i) {  // the bytes held: whole parts, then the first short one
    b.got += got[i];
    if (got[i] < std::min(part, len - i * part)) break;
  }
  return st;
}

void SourceWindow::start_read_ahead(uint64_t base) {
  if (base >= std::min(size_, end_) || !dfd_.valid()) return;
  next_.base = base;
  next_.got = 0;
  ahead_ = srcwin_pool().submit([this, base] { return read_direct(next_, base); });
}

Status SourceWindow::finish_read_ahead() {
  if (!ahead_.valid()) return Status::Ok();
  return ahead_.get();
}

Result<SourceWindow::Span> SourceWindow::at(uint64_t off, uint64_t n, const std::string& what) {
  if (off + n > end_ || off + n < off) return Status::Internal("SourceWindow: bytes asked for past the declared end, copying to '" + what + "'");
  if (off > size_ || size_ - off < n)
    return Status::Error("ShortSource", "source file (" + std::to_string(size_) + " bytes) ended before bytes [" + std::to_string(off) +
                                            ", " + std::to_string(off + n) + ") while copying to '" + what + "'");
  if (n == 0) return Span{"", 0};
  if (cur_direct_ && off >= cur_.base && off < cur_.base + cur_.got) return Span{cur_.p + (off - cur_.base), std::min(n, cur_.base + cur_.got - off)};
  if (!cur_direct_ && map_ && off >= map_base_ && off < map_base_ + map_len_)
    return Span{static_cast<const char*>(map_) + (off - map_base_), std::min(n, map_base_ + map_len_ - off)};
  const uint64_t base = off / window_ * window_;
  if (dfd_.valid()) {
    const bool ahead = ahead_.valid();
    Status st = finish_read_ahead();
    if (ahead && st.ok() && next_.base == base) {
      std::swap(cur_, next_);
    } else {
      // kAuto: a window already in the page cache is mapped (memory speed), not read from disk.
      if (st.ok() && mode_ == IoMode::kAuto && resident(base, std::min(window_, size_ - base))) return map_window(base, off, n);
      if (st.ok()) st = read_direct(cur_, base);
    }
    if (st.code() == "Unsupported") dfd_.reset();  // refused: mapped from now on
    else if (!st.ok()) return st;
    if (dfd_.valid()) {
      drop_map();
      cur_direct_ = true;
      if (off >= cur_.base + cur_.got) return Status::Error("ShortSource", "source file shrank while copying to '" + what + "'");
      start_read_ahead(cur_.base + window_);
      return Span{cur_.p + (off - cur_.base), std::min(n, cur_.base + cur_.got - off)};
    }
  }
  return map_window(base, off, n);
}

Status read_file_blocks_io(int fd, uint64_t off, uint64_t n, IoMode mode, const std::string& what,
                           const std::function<void(const void*, size_t)>& each_block) {
  if (mode == IoMode::kBuffered) return read_file_blocks(fd, off, n, what, each_block);
  constexpr uint64_t kWindow = 4ull << 20;
  SourceWindow w(fd, mode, kWindow, off + n);
  CKPT_RETURN_IF_ERROR(w.init(what));
  for (uint64_t done = 0; done < n;) {
    CKPT_ASSIGN_OR_RETURN(const SourceWindow::Span sp, w.at(off + done, n - done, what));
    if (!sp.p) return read_file_blocks(fd, off + done, n - done, what, each_block);  // not mappable: pread
    // Mapped windows are read under read_file_blocks' SIGBUS guard (a source that shrinks).
    if (w.last_was_direct()) each_block(sp.p, static_cast<size_t>(sp.n));
    else CKPT_RETURN_IF_ERROR(read_file_blocks(fd, off + done, sp.n, what, each_block));
    done += sp.n;
  }
  return Status::Ok();
}

}  // namespace ckpt
