// SourceBlocks: direct reads of source files with a deep read-ahead that lasts across calls: the
// way copies read their sources when many small copies (one tensor piece each) walk forward
// through the same few files, as a reshard's copies do.
//
// A file is read in aligned blocks of kSourceBlockBytes with O_DIRECT into reused buffers (no new
// page-cache pages: those are what is slow in an idle VM, LIMITS.md). Asking for a block starts
// the reads of the next `depth` blocks of the same file on reader threads, so each file has
// `depth` blocks of reads in flight while its bytes are copied: the disk rewards that (dd
// iflag=direct of 8 files: 8 x 4 MiB in flight 3.0-4.2 s, 8 x 64 MiB 2.3-2.5 s; docs/BENCHMARKS.md). A
// block whose bytes have all been taken is freed at once; blocks nobody asks for again go first
// when room is needed. All blocks together stay within the capacity given at construction.
// A block is the same bytes whoever asks: copies of distinct threads share the blocks of a file.
// Where the file system refuses O_DIRECT the caller gets no block (`Lease::p` null) and reads its
// own way. A source that ends before the bytes asked for is a "ShortSource" error.
// A descriptor is stat'ed once, the first time it is asked for (its file and size remembered): a
// descriptor given to get() must stay open on the same file while this object is used (sources
// stay open for a job; before, an fstat per get() made ~413,000 calls in a 3 GB reshard).
// A BlockTap (set_tap) sees the bytes of chosen ranges of the files, each range in order, as the
// blocks holding them are read: a checksum of source ranges computed from the reads the copies do
// anyway (reshard's source check with --io direct reads SRC once). A block is held while the tap
// reads it; a range one of whose blocks went before its turn (taken whole, or evicted for room,
// before the range's earlier bytes were read) is fed no further: the tap checks it its own way.
// A reader thread feeds a read-ahead block after marking it ready, with no lock held, so the copy
// that took the block may return before the tap has seen it: what a tap has seen is final only once
// the SourceBlocks is destroyed (its readers joined). A tap read before then must take a range not
// yet fed whole as unseen (CopyVerify::finish reads it again).
// Thread safety: every method from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "formats/base/fs_util.h"
#include "formats/base/status.h"
#include "formats/io/io_buffer.h"

namespace ckpt {

class ThreadPool;

inline constexpr uint64_t kSourceBlockBytes = 8ull << 20;

class BlockTap {
 public:
  struct Range {
    uint64_t id = 0, off = 0, bytes = 0;
  };
  virtual ~BlockTap() = default;
  // The ranges of the file (st_dev, st_ino) the tap wants to see; asked once per file.
  virtual std::vector<Range> ranges(uint64_t dev, uint64_t ino) = 0;
  // Bytes [off, off + n) of range `id`: every range's bytes in order, on one thread at a time per
  // range (any thread; no lock of the SourceBlocks held; possibly after the copies that took the
  // block have returned).
  virtual void feed(uint64_t id, uint64_t off, const char* p, uint64_t n) = 0;
};

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
    bool no_room = false;     // get(..., wait_for_room false): every block is held; nothing leased
  };
  // The block of `fd` holding byte `off` (of [off, off + want)); `end`: the caller will not ask
  // for bytes at or past it in this file (no read-ahead past it). Errors name `what`.
  // `wait_for_room` false: when every block is held, returns at once with Lease::no_room (a caller
  // that holds leases releases them and asks again: no caller waits while it holds blocks).
  Result<Lease> get(int fd, uint64_t off, uint64_t want, uint64_t end, const std::string& what, bool wait_for_room = true);
  // `used` bytes of the lease were taken (a block all of whose bytes are taken is freed).
  void release(const Lease& l, uint64_t used);

  struct Stats {
    uint64_t blocks_read = 0, bytes_read = 0;  // direct reads done
    uint64_t waits = 0;                         // asks that waited for a read in flight
    uint64_t evicted_unused = 0;                // read-ahead blocks freed before anyone asked for them
    uint64_t peak_blocks = 0;                   // blocks held at once, at most (<= the capacity)
  };
  Stats stats() const;
  // The tap that sees the blocks read from now on (files first asked for afterwards); null: none.
  void set_tap(std::shared_ptr<BlockTap> tap);
  uint64_t capacity() const { return cap_blocks_ * kSourceBlockBytes; }

 private:
  struct File;
  Result<File*> file_of(int fd, const std::string& what);  // mu_ held
  Block* find(File& f, uint64_t idx);                            // mu_ held
  Block* start_read(File& f, uint64_t idx, bool demand);         // mu_ held; null: no room
  bool make_room(bool demand);                                   // mu_ held
  void read_block(Block* b);
  void tap_block(std::unique_lock<std::mutex>& l, Block* b);  // feeds the ranges whose turn b is
  void drop_if_done(Block* b);                                 // mu_ held; frees b once all taken
  bool awaited(const Block& b) const;                          // mu_ held

  const uint64_t cap_blocks_;
  const int depth_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<uint64_t, uint64_t>, std::unique_ptr<File>> files_;  // (dev, ino)
  std::unordered_map<int, File*> by_fd_;  // descriptors seen: no fstat per get() (the newfstatat storm)
  std::vector<std::unique_ptr<Block>> blocks_;
  std::vector<IoBuffer> free_;
  uint64_t stamp_ = 0;
  Stats stats_;
  std::shared_ptr<BlockTap> tap_;
  std::unique_ptr<ThreadPool> readers_;  // its threads start with the first read-ahead
};

}  // namespace ckpt
