// HeldBlocks: the blocks of a SourceBlocks (formats/io/source_blocks.h) that OutputFile::copy_runs
// holds across its ranges, at most kHeld (one per source file): the rows of tp column blocks
// alternate between a few files, a few KiB each, and take no lock each. It never waits for room
// while it holds a block: asked for one when every block is held, it lets its own go and asks again.
// Thread safety: one copying thread per object.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/base/status.h"
#include "formats/io/source_blocks.h"

namespace ckpt {

class HeldBlocks {
 public:
  struct Held {
    int fd;
    uint64_t off;  // file offset of ls.p
    SourceBlocks::Lease ls;
    uint64_t used = 0;
  };
  explicit HeldBlocks(SourceBlocks& b) : b_(b) {}
  ~HeldBlocks() { release_all(); }
  // The held block with byte `off` of `fd`, leased now if needed; null: not direct-readable.
  Result<Held*> get(int fd, uint64_t off, uint64_t want, const std::string& what) {
    for (Held& h : held_)
      if (h.fd == fd && off >= h.off && off - h.off < h.ls.n) return &h;
    for (size_t i = 0; i < held_.size(); ++i)
      if (held_[i].fd == fd || (i == 0 && held_.size() >= kHeld)) drop(i--);
    CKPT_ASSIGN_OR_RETURN(SourceBlocks::Lease ls, b_.get(fd, off, want, UINT64_MAX, what, /*wait_for_room=*/held_.empty()));
    if (ls.no_room) {
      release_all();
      CKPT_ASSIGN_OR_RETURN(ls, b_.get(fd, off, want, UINT64_MAX, what));
    }
    if (!ls.p) return nullptr;
    held_.push_back({fd, off, ls, 0});
    return &held_.back();
  }
  void release_all() {
    while (!held_.empty()) drop(held_.size() - 1);
  }

 private:
  static constexpr size_t kHeld = 2;
  void drop(size_t i) {
    b_.release(held_[i].ls, held_[i].used);
    held_.erase(held_.begin() + static_cast<long>(i));
  }
  SourceBlocks& b_;
  std::vector<Held> held_;
};

}  // namespace ckpt
