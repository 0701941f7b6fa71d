// OutputFile: the one place where ckpt's data writers (native store shards, safetensors files)
// choose how bytes reach the disk: through the page cache (buffered) or around it (O_DIRECT).
//
// Direct mode writes every whole 4 KiB-aligned block of a write with O_DIRECT: straight from the
// caller's memory when it lies at the same address modulo 4 KiB as its file offset
// (formats/tensor/write_placement.h lets the executor place chunks so), else from an aligned
// staging buffer (4 MiB per writing thread, reused); the unaligned head and tail of a write (and
// writes smaller than a block) go through the page cache on a second, buffered descriptor of the
// same file. Two descriptors never write the same page: a page written directly lies wholly inside
// one write, so every page holds bytes of one kind only and the file's bytes are the same in both
// modes. Where the file system refuses O_DIRECT -- open fails, or a direct write fails with
// EINVAL (overlay and FUSE file systems, odd alignment rules) -- the file falls back to buffered
// writes for good and the write is redone buffered: never an error.
//
// IoMode kAuto picks direct for files of at least kAutoDirectMinBytes: below that, the page cache
// absorbs the whole file and the final fsync is short, so buffered is as fast or faster (measured:
// docs/BENCHMARKS.md "--io auto threshold").
//
// copy_runs gathers file ranges (FileExtent, e.g. the rows of tp column blocks) back to back into
// the file: sources are read a window at a time (SourceWindow, formats/io/source_window.h: O_DIRECT
// with the next window read ahead when the file was opened with IoMode kDirect; else mapped) and
// copied into the staging buffer (a source that shrinks is a "ShortSource" error, never SIGBUS);
// a single range in buffered mode is copy_file_bytes (formats/base/file_io.h). With a SourceBlocks
// given (set_read_ahead), sources are read through it instead, whatever the IoMode: direct reads
// kept ahead across calls (formats/io/source_blocks.h), direct windows only where it gives no block.
// With a WritePool given (set_write_pool, formats/io/write_pool.h), copy_runs gathers into the
// pool's large buffers (kWriteRequestBytes) instead of the thread's 4 MiB stage, and each full
// buffer is written on the pool's threads while the copy goes on (several requests in flight, of
// this file and of others; a call returns with its last writes still in flight): each byte is still
// seen once by `each_block`, in order, before it is written, and the file's bytes are the same.
// write() likewise stages there what it cannot write straight from the caller's memory (a source
// not at its file offset's phase modulo 4 KiB: the trainer's saves, the executor's unplaced
// chunks), and returns with those writes in flight: the caller's memory is free on return.
// Errors of writes in flight are returned by the next copy_runs or write() through the pool, or by
// close(); close() and destruction wait for them. Sources read through a SourceBlocks keep the blocks they are copying
// from leased across ranges (at most two files at a time), so rows of a few KiB from alternating
// files take no lock each.
// Thread safety: write() and copy_runs() may run concurrently on distinct byte ranges; open,
// close and moves one thread at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "formats/base/fs_util.h"
#include "formats/base/io_mode.h"
#include "formats/base/status.h"
#include "formats/io/write_blocks.h"
#include "formats/io/write_pool.h"
#include "formats/tensor/tensor_io.h"

namespace ckpt {

inline constexpr uint64_t kDirectAlignBytes = 4096;
// Memory a thread copying with OutputFile::copy_runs holds at most: its 4 MiB staging buffer, its
// source windows (8 MiB mapped, or two direct halves) and up to 8 MiB of free direct read buffers.
inline constexpr uint64_t kCopyThreadBytes = uint64_t{20} << 20;
// ... and when its sources are read through a SourceBlocks (set_read_ahead): its staging buffer.
inline constexpr uint64_t kCopyThreadReadAheadBytes = uint64_t{4} << 20;
extern const uint64_t kAutoDirectMinBytes;  // output_file.cc: the measured threshold

// "auto", "buffered", "direct"; errors (kInvalidArgument) name `flag` and the accepted values.
Result<IoMode> parse_io_mode(const std::string& spec, const std::string& flag);
const char* io_mode_name(IoMode m);
// kAuto: kDirect for files of at least kAutoDirectMinBytes, else kBuffered; others unchanged.
IoMode resolve_io_mode(IoMode m, uint64_t file_bytes);

// Help text of the `--io` flag (reshard, from-hf, to-hf).
const char* io_flag_help();

class SourceBlocks;
class WritePool;

class OutputFile {
 public:
  OutputFile() = default;
  // Opens `path` with `flags` (O_WRONLY plus O_CREAT/O_TRUNC/O_EXCL as wanted) for positional
  // writes; `mode` kAuto resolves with `file_bytes` (the size the file will have).
  static Result<OutputFile> open(const std::string& path, int flags, IoMode mode, uint64_t file_bytes);
  // A descriptor opened elsewhere (a memfd), taken over and written buffered; `path` names it in errors.
  static OutputFile adopt(ScopedFd fd, std::string path);

  bool valid() const { return st_ && st_->fd.valid(); }
  int fd() const { return st_ ? st_->fd.get() : -1; }  // the buffered descriptor (ftruncate, fsync)
  bool direct() const { return st_ && st_->direct.load(); }  // false in buffered mode and after a fallback
  const std::string& path() const { return st_->path; }

  // Writes exactly `n` bytes at `off` (with a WritePool, possibly still in flight on return:
  // close() waits); kIo naming the path on error (disk full, ...).
  Status write(const void* src, uint64_t n, uint64_t off) const;
  // Writes the ranges `runs`, back to back, at `off`; `each_block` (optional) sees the written
  // bytes in order just before they are written. Errors name the path (ShortSource: a source
  // ended early).
  Status copy_runs(const std::vector<FileExtent>& runs, uint64_t off,
                   const std::function<void(const void*, size_t)>& each_block = {}) const;
  // copy_runs reads its sources direct, through `blocks` (read-ahead across calls,
  // formats/io/source_blocks.h); not owned; null: as the IoMode the file was opened with says.
  void set_read_ahead(SourceBlocks* blocks) {
    st_->read_ahead = blocks;
    if (blocks) st_->read_io = IoMode::kDirect;
  }
  // copy_runs stages its bytes in `pool`'s buffers and writes them on its threads; not owned (it
  // must outlive this file's writes: close() or reset() first); null: the calling thread's stage.
  void set_write_pool(WritePool* pool) { st_->pool = pool; }
  // After set_write_pool: the byte ranges the writer will fill (each byte once, by copy_runs or
  // write()); the copies inside them then gather into whole requests across calls and threads
  // (WriteBlocks, formats/io/write_blocks.h) instead of each call ending with a partial one; writes
  // from memory go out as without and are counted in. Bytes outside them are written as without.
  // kInternal: ranges that overlap, a write or copy across a range's edge, a byte written twice.
  Status gather_ranges(std::vector<ByteRange> ranges);
  // Waits for the writes in flight (set_write_pool): their first error. Before an fsync of fd().
  Status wait() const;
  Status close();  // waits for writes in flight; closes both descriptors; "close failed" naming the path
  void reset();    // closes, ignoring errors

 private:
  struct State {
    ScopedFd fd, dfd;  // buffered; O_DIRECT (invalid when not direct)
    std::atomic<bool> direct{false};
    IoMode read_io = IoMode::kBuffered;  // how copy_runs reads its sources (SourceWindow)
    SourceBlocks* read_ahead = nullptr;  // copy_runs' sources read through it (read_io kDirect)
    WritePool* pool = nullptr;           // copy_runs' stages and writes (set_write_pool)
    std::string path;
    WriteGroup writes;  // destroyed (waited for) before the descriptors close
    std::unique_ptr<WriteBlocks> blocks;  // gather_ranges; destroyed first (no more writes), then `writes` waits
  };
  class Stage;  // copy_runs' staging buffers (output_file.cc)
  static Status write_staged(State& st, const char* stage, uint64_t base, uint64_t a, uint64_t b);
  static Status write_direct(State& st, const char* p, uint64_t n, uint64_t off);
  // One pool request: `ranges` of the file from `buf` (byte 0 = file offset `base`), by `route`.
  static Status write_request(State& st, WritePool::Route route, const char* buf, uint64_t base, const std::vector<ByteRange>& ranges);
  static Status write_now(State& st, const char* p, uint64_t n, uint64_t off);  // write() less the gathered ranges' count
  static Status write_pooled(State& st, const char* p, uint64_t n, uint64_t off);
  std::unique_ptr<State> st_;
};

}  // namespace ckpt
