// SourceBlocks: direct reads of source files with a deep read-ahead that lasts across calls: the
// way copies read their sources when many small copies (one tensor piece each) walk forward
// through the same few files, as a reshard's copies do.
//
// A file is read in aligned blocks of kSourceBlockBytes with O_DIRECT into reused buffers (no new
// page-cache pages: those are what is slow in an idle VM, LIMITS.md). Asking for a block starts
// the reads of the next `depth` blocks of the same file on reader threads, so each file has
// `depth` blocks of reads in flight while its bytes are copied: the disk rewards that (dd
// iflag=direct of 8 files: 8 x 4 MiB in flight 3.0-4.2 s, 8 x 64 MiB 2.3-2.5 s, issue 15). A
// block whose bytes have all been taken is freed at once; blocks nobody asks for again go first
// when room is needed. All blocks together stay within the capacity given at construction.
// A block is the same bytes whoever asks: copies of distinct threads share the blocks of a file.
// Where the file system refuses O_DIRECT the caller gets no block (`Lease::p` null) and reads its
// own way. A source that ends before the bytes asked for is a "ShortSource" error.
// Thread safety: every method from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "formats/fs_util.h"
#include "formats/io_buffer.h"
#include "formats/status.h"

namespace ckpt {

class ThreadPool;

inline constexpr uint64_t kSourceBlockBytes = 8ull << 20;

class SourceBlocks {
 public:
  // `capacity`: bytes of blocks at most (at least 2 blocks); `depth`: blocks read ahead per file.
  SourceBlocks(uint64_t capacity, int depth);
  ~SourceBlocks();
  SourceBlocks(const SourceBlocks&) = delete;
  SourceBlocks& operator=(const SourceBlocks&) = delete;

  struct Block;
  // Bytes of a block held for the caller until release().
  struct Lease {
    const char* p = nullptr;  // null: read the file another way (O_DIRECT refused, not a regular file)
    uint64_t n = 0;           // bytes at p, from the offset asked for to the end of its block
    Block* block = nullptr;
  };
  // The block of `fd` holding byte `off` (of [off, off + want)); `end`: the caller will not ask
  // for bytes at or past it in this file (no read-ahead past it). Errors name `what`.
  Result<Lease> get(int fd, uint64_t off, uint64_t want, uint64_t end, const std::string& what);
  // `used` bytes of the lease were taken (a block all of whose bytes are taken is freed).
  void release(const Lease& l, uint64_t used);

  struct Stats {
    uint64_t blocks_read = 0, bytes_read = 0;  // direct reads done
    uint64_t waits = 0;                         // asks that waited for a read in flight
    uint64_t evicted_unused = 0;                // read-ahead blocks freed before anyone asked for them
    uint64_t peak_blocks = 0;                   // blocks held at once, at most (<= the capacity)
  };
  Stats stats() const;
  uint64_t capacity() const { return cap_blocks_ * kSourceBlockBytes; }

 private:
  struct File;
  Result<File*> file_of(int fd, const std::string& what);  // mu_ held
  Block* find(File& f, uint64_t idx);                            // mu_ held
  Block* start_read(File& f, uint64_t idx, bool demand);         // mu_ held; null: no room
  bool make_room(bool demand);                                   // mu_ held
  void read_block(Block* b);

  const uint64_t cap_blocks_;
  const int depth_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<uint64_t, uint64_t>, std::unique_ptr<File>> files_;  // (dev, ino)
  std::vector<std::unique_ptr<Block>> blocks_;
  std::vector<IoBuffer> free_;
  uint64_t stamp_ = 0;
  Stats stats_;
  std::unique_ptr<ThreadPool> readers_;
};

}  // namespace ckpt
