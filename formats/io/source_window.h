// SourceWindow: the one place where ckpt's streaming copies read a source file (the gathers of
// OutputFile::copy_runs: native store datasets, safetensors data sections, tp column blocks), a
// window of a few MiB at a time, walking forward through the file.
//
// How a window is read (IoMode, formats/io/output_file.h):
//  - kBuffered: mapped (the page cache; MAP_POPULATE, the next window advised WILLNEED).
//  - kDirect: read with O_DIRECT into an aligned buffer (reused, per thread), on a second
//    descriptor of the same file (opened through /proc/self/fd, so the source's own descriptor
//    and its file position are untouched); the next window is read ahead on a helper thread
//    while the caller copies and writes this one, so a direct copy takes max(read, write), not
//    their sum. Unaligned heads and tails need no buffered read: the window is the aligned
//    range around the bytes asked for (a read past the end of the file stops at the end).
//  - kAuto: per window, mapped when every page of it is already in the page cache (mincore:
//    a warm source is read at memory speed), else direct (a cold source bypasses the page cache,
//    whose new pages are slow in an idle VM). Commands decide per source instead: `--io auto`
//    reads a source mostly in the page cache mapped and a cold one direct through SourceBlocks
//    (page_cache_share, converters/source/job_source.h: JobSource::cold).
// Where the file system refuses O_DIRECT (open or read fails with EINVAL: tmpfs on old kernels,
// overlayfs, FUSE) the window falls back to mapping, then to pread, for good: never an error.
// A source that ends before the bytes asked for is a "ShortSource" error (never SIGBUS).
// Bytes are the same in every mode: O_DIRECT reads see dirty page-cache pages (the kernel writes
// them back first).
// Thread safety: one thread per object; the read-ahead runs on an internal pool.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <string>

#include "formats/base/fs_util.h"
#include "formats/base/status.h"
#include "formats/io/io_buffer.h"
#include "formats/io/output_file.h"

namespace ckpt {

// Free direct-read buffers each thread keeps for reuse (bytes).
inline constexpr uint64_t kSourceBufferCacheBytes = 8ull << 20;

class SourceWindow {
 public:
  // `fd`: the source (not owned, open for reading); `window`: bytes per window (<= 64 MiB);
  // `end`: no byte at or past it will be asked for (direct reads stop there: no read-ahead past
  // the caller's last range).
  SourceWindow(int fd, IoMode mode, uint64_t window, uint64_t end = UINT64_MAX);
  ~SourceWindow();
  SourceWindow(const SourceWindow&) = delete;
  SourceWindow& operator=(const SourceWindow&) = delete;

  // fstat (size, type) and, for kDirect / kAuto, the O_DIRECT descriptor; errors name `what`.
  Status init(const std::string& what);
  int fd() const { return fd_; }
  uint64_t file_size() const { return size_; }
  // Windows are aligned tiles of the file, [i * window, (i + 1) * window).
  struct Span {
    const char* p = nullptr;  // nullptr: the file can be neither read direct nor mapped (not a
                              // regular file, mmap refused): the caller preads
    uint64_t n = 0;           // bytes at p: from off to the end of its window, at most the n asked
  };
  // The first bytes of [off, off + n) (those in off's window), valid until the next call.
  // "ShortSource" when the file ends before off + n (errors name `what`).
  Result<Span> at(uint64_t off, uint64_t n, const std::string& what);
  // Which way the last window was read (tests, tracing).
  bool last_was_direct() const { return cur_direct_; }

 private:
  struct Buf {
    IoBuffer mem;
    char* p = nullptr;        // mem.data()
    uint64_t base = 0, got = 0;  // file bytes [base, base + got) held
  };
  bool resident(uint64_t base, uint64_t len) const;
  Span map_window(uint64_t base, uint64_t off, uint64_t n);
  Status read_direct(Buf& b, uint64_t base);
  void start_read_ahead(uint64_t base);
  void drop_map();
  Status finish_read_ahead();

  int fd_;
  IoMode mode_;
  std::string what_;
  uint64_t window_, end_, buf_bytes_ = 0, size_ = 0;
  bool regular_ = false, unmappable_ = false, cur_direct_ = false;
  ScopedFd dfd_;             // O_DIRECT; invalid in buffered mode and after a refusal
  void* map_ = nullptr;      // mapped window
  uint64_t map_base_ = 0, map_len_ = 0;
  Buf cur_, next_;           // direct windows: the current one and the one read ahead
  std::future<Status> ahead_;  // the read of next_, when one is running
};

// Reads [off, off + n) of `fd` window by window in `mode` (SourceWindow), `each_block` seeing
// the bytes in order; errors name `what`. read_file_blocks (formats/base/file_io.h) in any mode.
Status read_file_blocks_io(int fd, uint64_t off, uint64_t n, IoMode mode, const std::string& what,
                           const std::function<void(const void*, size_t)>& each_block);

}  // namespace ckpt
