#include "formats/io/source_blocks.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "formats/base/thread_pool.h"

namespace ckpt {

namespace {

constexpr uint64_t kAlign = 4096;

Status short_source(uint64_t size, uint64_t off, uint64_t want, const std::string& what) {
  return Status::Error("ShortSource", "source file (" + std::to_string(size) + " bytes) ended before bytes [" + std::to_string(off) + ", " +
                                          std::to_string(off + want) + ") while copying to '" + what + "'");
}

}  // namespace

struct SourceBlocks::File {
  struct Tapped {
    BlockTap::Range r;
    uint64_t next = 0;  // the tap has seen [r.off, next)
    bool busy = false;  // a thread is feeding it
  };
  std::vector<Tapped> taps;  // sorted by offset, disjoint
  ScopedFd dfd;          // O_DIRECT; invalid: could not be opened so
  bool refused = false;  // a direct read failed with EINVAL: read another way (dfd stays open: reads may be in flight)
  uint64_t size = 0;
  std::string what;
};

struct SourceBlocks::Block {
  File* file = nullptr;
  uint64_t idx = 0;     // bytes [idx * kSourceBlockBytes, + got) of the file
  IoBuffer mem;
  uint64_t got = 0, taken = 0;
  uint64_t stamp = 0;    // when last asked for (0: a read-ahead nobody asked for yet)
  uint64_t started = 0;  // when its read was started
  bool ready = false;
  int refs = 0;
  Status st;
};

SourceBlocks::SourceBlocks(uint64_t capacity, int depth)
    : cap_blocks_(std::max<uint64_t>(4, capacity / kSourceBlockBytes)),
      depth_(std::max(0, depth)),
      // a reader per block of capacity (every block can be in flight at once); ThreadPool starts
      // them with the first read-ahead
      readers_(std::make_unique<ThreadPool>(static_cast<int>(std::min<uint64_t>(cap_blocks_, 64)))) {}

SourceBlocks::~SourceBlocks() { readers_.reset(); }  // reads in flight finish before the blocks go

Result<SourceBlocks::File*> SourceBlocks::file_of(int fd, const std::string& what) {
  if (auto known = by_fd_.find(fd); known != by_fd_.end()) return known->second;  // stat'ed once per descriptor
  struct stat sb {};
  if (::fstat(fd, &sb) != 0) return Status::FromErrno("cannot stat a source of", what, errno);
  auto& slot = files_[{static_cast<uint64_t>(sb.st_dev), static_cast<uint64_t>(sb.st_ino)}];
  if (!slot) {
    slot = std::make_unique<File>();
    slot->what = what;
    if (tap_)
      for (const BlockTap::Range& r : tap_->ranges(static_cast<uint64_t>(sb.st_dev), static_cast<uint64_t>(sb.st_ino)))
        slot->taps.push_back({r, r.off, false});
    std::sort(slot->taps.begin(), slot->taps.end(), [](const auto& a, const auto& b) { return a.r.off < b.r.off; });
    if (S_ISREG(sb.st_mode)) {
      // A new open file description: O_DIRECT on it leaves `fd` and its position as they are.
      const int d = ::open(("/proc/self/fd/" + std::to_string(fd)).c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
      if (d >= 0) slot->dfd = ScopedFd(d);
    }
  }
  slot->size = sb.st_size > 0 ? static_cast<uint64_t>(sb.st_size) : 0;
  by_fd_[fd] = slot.get();
  return slot.get();
}

SourceBlocks::Block* SourceBlocks::find(File& f, uint64_t idx) {
  for (auto& b : blocks_)
    if (b->file == &f && b->idx == idx) return b.get();
  return nullptr;
}

// Room for one more block. A read-ahead takes free room only, and leaves one block of it for the
// next demand. A demand takes free room, else frees (1) the read-ahead block started last (the
// furthest ahead of its file: cheaper to read again than a block some copy is halfway through),
// else (2) the least recently used block nobody holds.
bool SourceBlocks::make_room(bool demand) {
  if (blocks_.size() + (demand ? 0 : 1) < cap_blocks_) return true;
  if (!demand) return false;
  auto victim = blocks_.end();
  auto better = [](const Block& b, const Block& v) {
    if ((b.stamp == 0) != (v.stamp == 0)) return b.stamp == 0;  // unused read-ahead first
    return b.stamp == 0 ? b.started > v.started : b.stamp < v.stamp;
  };
  for (auto it = blocks_.begin(); it != blocks_.end(); ++it) {
    const Block& b = **it;
    if (!b.ready || b.refs > 0) continue;
    if (victim == blocks_.end() || better(b, **victim)) victim = it;
  }
  if (victim == blocks_.end()) return false;
  if ((*victim)->stamp == 0) ++stats_.evicted_unused;
  free_.push_back(std::move((*victim)->mem));
  blocks_.erase(victim);
  return true;
}

SourceBlocks::Block* SourceBlocks::start_read(File& f, uint64_t idx, bool demand) {
  if (!make_room(demand)) return nullptr;
  auto b = std::make_unique<Block>();
  b->file = &f;
  b->idx = idx;
  b->started = ++stamp_;
  if (!free_.empty()) {
    b->mem = std::move(free_.back());
    free_.pop_back();
  } else {
    b->mem = IoBuffer(kSourceBlockBytes);
  }
  Block* raw = b.get();
  blocks_.push_back(std::move(b));
  stats_.peak_blocks = std::max<uint64_t>(stats_.peak_blocks, blocks_.size());
  if (!demand) readers_->submit([this, raw] { read_block(raw); });
  return raw;
}

// O_DIRECT reads of the whole block (or up to the end of the file); marks it ready.
void SourceBlocks::read_block(Block* b) {
  uint64_t got = 0;
  Status st;
  if (!b->mem.data()) st = Status::Io("cannot allocate a " + std::to_string(kSourceBlockBytes >> 20) + " MiB read buffer");
  const uint64_t base = b->idx * kSourceBlockBytes;
  while (st.ok() && got < kSourceBlockBytes) {
    const ssize_t r = ::pread(b->file->dfd.get(), b->mem.data() + got, kSourceBlockBytes - got, static_cast<off_t>(base + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EINVAL || errno == EOPNOTSUPP)) st = Status::Unsupported("O_DIRECT read refused");
    else if (r < 0) st = Status::FromErrno("direct read failed (a source of)", b->file->what, errno);
    if (r <= 0) break;
    got += static_cast<uint64_t>(r);
    if (got % kAlign != 0) break;  // the end of the file
  }
  std::unique_lock<std::mutex> l(mu_);
  b->got = got;
  b->st = std::move(st);
  b->ready = true;
  ++stats_.blocks_read;
  stats_.bytes_read += got;
  cv_.notify_all();
  tap_block(l, b);
}

// For each tapped range whose next bytes are in `b`: feeds them, then the same range's bytes in the
// blocks after `b` that are already read, each block held (refs) while the tap reads it unlocked.
void SourceBlocks::tap_block(std::unique_lock<std::mutex>& l, Block* b) {
  const std::shared_ptr<BlockTap> tap = tap_;  // set_tap may change tap_ while this feeds
  if (!tap || !b->st.ok()) return;
  File& f = *b->file;
  const uint64_t base = b->idx * kSourceBlockBytes, end = base + b->got;
  auto it = std::upper_bound(f.taps.begin(), f.taps.end(), base, [](uint64_t v, const File::Tapped& t) { return v < t.r.off + t.r.bytes; });
  // `b` held till all its ranges are fed: a copy may take it whole and release it while the tap
  // reads one of them unlocked, and the next range must not find it freed.
  ++b->refs;
  for (; it != f.taps.end() && it->r.off < end; ++it) {
    File::Tapped& t = *it;
    const uint64_t r_end = t.r.off + t.r.bytes;
    if (t.busy || t.next < base || t.next >= std::min(end, r_end)) continue;  // not this block's turn
    t.busy = true;
    for (Block* cur = b; cur;) {
      ++cur->refs;
      const uint64_t cb = cur->idx * kSourceBlockBytes, ce = std::min(cb + cur->got, r_end), from = t.next;
      l.unlock();
      tap->feed(t.r.id, from, cur->mem.data() + (from - cb), ce - from);
      l.lock();
      t.next = ce;
      --cur->refs;
      Block* fed = cur;
      cur = nullptr;
      if (t.next < r_end && fed->got == kSourceBlockBytes) {
        Block* nx = find(f, fed->idx + 1);
        if (nx && nx->ready && nx->st.ok()) cur = nx;
      }
      drop_if_done(fed);
    }
    t.busy = false;
  }
  --b->refs;
  drop_if_done(b);
  cv_.notify_all();
}

// A block a tap is being fed towards (a range whose feeding is under way, at an earlier block) stays
// till the feeding reaches it: a copy may take a block whole faster than the tap digests the last.
bool SourceBlocks::awaited(const Block& b) const {
  const uint64_t base = b.idx * kSourceBlockBytes;
  for (const File::Tapped& t : b.file->taps)
    if (t.busy && t.next < base && t.r.off + t.r.bytes > base) return true;
  return false;
}

void SourceBlocks::drop_if_done(Block* b) {
  if (b->refs != 0 || b->taken < b->got || awaited(*b)) return;  // held, bytes not yet taken, or a tap's turn to come
  auto it = std::find_if(blocks_.begin(), blocks_.end(), [b](const auto& x) { return x.get() == b; });
  free_.push_back(std::move(b->mem));
  blocks_.erase(it);
}

void SourceBlocks::set_tap(std::shared_ptr<BlockTap> tap) {
  std::lock_guard<std::mutex> l(mu_);
  tap_ = std::move(tap);
}

Result<SourceBlocks::Lease> SourceBlocks::get(int fd, uint64_t off, uint64_t want, uint64_t end, const std::string& what,
                                              bool wait_for_room) {
  std::unique_lock<std::mutex> l(mu_);
  CKPT_ASSIGN_OR_RETURN(File * f, file_of(fd, what));
  if (!f->dfd.valid() || f->refused) return Lease{};
  if (off > f->size || f->size - off < want) return short_source(f->size, off, want, what);
  const uint64_t idx = off / kSourceBlockBytes;
  Block* b = nullptr;
  bool demand = false;
  while (!(b = find(*f, idx))) {
    if ((b = start_read(*f, idx, true))) {
      demand = true;
      break;
    }
    if (!wait_for_room) {
      Lease none;
      none.no_room = true;
      return none;
    }
    cv_.wait(l);  // no room: it comes back with a release or a finished read
  }
  ++b->refs;
  const uint64_t last = (std::min(end, f->size) + kSourceBlockBytes - 1) / kSourceBlockBytes;  // blocks [.., last) are wanted
  for (uint64_t j = idx + 1; j < last && j <= idx + static_cast<uint64_t>(depth_); ++j)
    if (!find(*f, j) && !start_read(*f, j, false)) break;
  if (demand && !b->ready) {
    l.unlock();
    read_block(b);  // on this thread: not queued behind read-aheads
    l.lock();
  }
  if (!b->ready) ++stats_.waits;
  cv_.wait(l, [b] { return b->ready; });
  b->stamp = ++stamp_;
  if (!b->st.ok()) {
    Status st = b->st;
    --b->refs;
    if (st.code() == "Unsupported") {
      f->refused = true;  // this file is read another way from now on
      return Lease{};
    }
    return st;
  }
  const uint64_t in = off - idx * kSourceBlockBytes;
  if (in >= b->got) {
    --b->refs;
    return short_source(idx * kSourceBlockBytes + b->got, off, want, what);
  }
  return Lease{b->mem.data() + in, b->got - in, b};
}

void SourceBlocks::release(const Lease& lease, uint64_t used) {
  if (!lease.block) return;
  std::lock_guard<std::mutex> l(mu_);
  Block* b = lease.block;
  --b->refs;
  b->taken += used;
  drop_if_done(b);  // every byte taken: nobody asks for this block again
  cv_.notify_all();
}

SourceBlocks::Stats SourceBlocks::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  return stats_;
}

}  // namespace ckpt
