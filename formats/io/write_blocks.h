// WriteBlocks: one file's bytes gathered into whole write requests across calls and threads.
//
// The file is cut at fixed offsets: block k holds the bytes [k R, (k+1) R), R = the pool's request
// size (formats/io/write_pool.h). Every copy that fills part of a block fills it in the block's one
// pool buffer, in any order and from any thread, and the block goes out as ONE request the moment
// the bytes the file's writer declared in it (`expected`) are all there. Why: a copy call that
// staged its own buffers ended with a partial request, and so did each piece of a reshard (pieces
// at HDF5's offsets, chunks of a few MiB, copied by four threads side by side): of a 3.08 GB
// reshard's 340 direct writes only 96 were whole 16 MiB requests, and it reached 0.73-0.76x of
// what the disk gives two writers of 16 MiB (docs/BENCHMARKS.md, 2026-11-29).
//
// Contract:
//  - `expected`: the byte ranges the writer will fill, each byte exactly once (adjacent ones merge);
//    overlapping ranges are refused at create(). Bytes outside them are not gathered (covers()).
//  - open(off): a slice of off's block, [off, block end), in its buffer (acquired from the pool on
//    a block's first touch; may wait: hold nothing another writer waits for). Only the bytes the
//    caller reports with fill(slice, k) count; fill(slice, 0) drops the slice.
//  - A byte filled twice, or outside `expected`, is an error (kInternal) naming the file and range.
//  - external(off, n): bytes the caller wrote itself, around the blocks (whole blocks from memory).
//  - A block whose bytes are all in is submitted to the pool: `write(route, buf, base, ranges)`
//    writes its `ranges` (file offsets, sorted) from `buf`, whose byte 0 is file offset `base`.
//  - release_one() (WritePool::Holder): when the pool has no free buffer and no write in flight,
//    the idle block touched longest ago goes out as it is (a partial request; the rest of that block
//    gathers in another buffer later). flush(): every block with bytes in goes out (before an fsync).
// Thread safety: every method from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "formats/base/status.h"
#include "formats/io/write_pool.h"

namespace ckpt {

struct ByteRange {
  uint64_t begin = 0, end = 0;
};

class WriteBlocks final : public WritePool::Holder {
 public:
  using Write = std::function<Status(WritePool::Route, const char* buf, uint64_t base, const std::vector<ByteRange>& ranges)>;
  // `path` names the file in errors; the pool and the group must outlive this.
  static Result<std::unique_ptr<WriteBlocks>> create(WritePool& pool, WriteGroup& group, std::vector<ByteRange> expected,
                                                     Write write, std::string path);
  ~WriteBlocks();  // unregisters; blocks not flushed give their buffers back unwritten
  WriteBlocks(const WriteBlocks&) = delete;
  WriteBlocks& operator=(const WriteBlocks&) = delete;

  enum class Cover { kInside, kOutside, kPartly };
  Cover covers(uint64_t off, uint64_t n) const;  // of `expected`
  // Whether a write of [off, off + n) is gathered here: inside `expected` true, outside false,
  // across a range's edge kInternal (`what`: "write", "copy").
  Result<bool> gathers(uint64_t off, uint64_t n, const char* what) const;
  uint64_t block_bytes() const { return r_; }

  struct Slice {
    char* p = nullptr;  // file offset `off` in the block's buffer
    uint64_t off = 0, n = 0;
  };
  Result<Slice> open(uint64_t off);
  Status fill(const Slice& s, uint64_t k);
  Status external(uint64_t off, uint64_t n);
  Status flush();
  bool release_one() override;

 private:
  struct Block {
    char* buf = nullptr;
    int writers = 0;                // open slices
    uint64_t expected = 0, got = 0;  // declared bytes in the block; bytes filled (in buffers or external)
    std::vector<ByteRange> filled;   // every filled range (merged): a byte twice is an error
    std::vector<ByteRange> unsent;   // filled in `buf`, not written yet (merged)
    uint64_t touched = 0;
  };
  struct Out {  // a buffer leaving the lock: written, or given back when it holds nothing
    char* buf = nullptr;
    uint64_t base = 0;
    std::vector<ByteRange> ranges;
  };
  WriteBlocks(WritePool& pool, WriteGroup& group, std::vector<ByteRange> expected, Write write, std::string path);
  uint64_t expected_in(uint64_t block) const;
  std::map<uint64_t, Block>::iterator block_at(uint64_t k);  // mu_ held: found, or made with its expected bytes
  // mu_ held: adds [a, b) to block `k` (checked); a complete block leaves in `out`.
  Status add_filled(uint64_t k, Block& b, uint64_t a, uint64_t e, bool in_buffer, Out& out);
  Status range_error(const char* what, uint64_t a, uint64_t b) const;
  void send(Out o);

  WritePool& pool_;
  WriteGroup& group_;
  const std::vector<ByteRange> expected_;  // sorted, merged
  const Write write_;
  const std::string path_;
  const uint64_t r_;
  mutable std::mutex mu_;
  std::map<uint64_t, Block> blocks_;  // touched and not complete, by index
  std::vector<bool> complete_;        // by index
  uint64_t seq_ = 0;
};

}  // namespace ckpt
