#include "formats/io/write_blocks.h"

#include <algorithm>

namespace ckpt {

namespace {

// Adds [a, e) to the sorted, merged `v`; false when it overlaps a range already there.
bool add_range(std::vector<ByteRange>& v, uint64_t a, uint64_t e) {
  auto it = std::lower_bound(v.begin(), v.end(), a, [](const ByteRange& r, uint64_t x) { return r.end < x; });
  if (it != v.end() && it->begin < e && a < it->end) return false;  // overlaps (a range ending at a is merged below)
  if (it != v.end() && it->end == a) {
    auto next = it + 1;
    if (next != v.end() && next->begin < e) return false;
    it->end = e;
    if (next != v.end() && next->begin == e) {
      it->end = next->end;
      v.erase(next);
    }
    return true;
  }
  if (it != v.end() && it->begin == e) {
    it->begin = a;
    return true;
  }
  v.insert(it, ByteRange{a, e});
  return true;
}

}  // namespace

Result<std::unique_ptr<WriteBlocks>> WriteBlocks::create(WritePool& pool, WriteGroup& group, std::vector<ByteRange> expected,
                                                         Write write, std::string path) {
  std::sort(expected.begin(), expected.end(), [](const ByteRange& x, const ByteRange& y) { return x.begin < y.begin; });
  std::vector<ByteRange> merged;
  for (const ByteRange& r : expected) {
    if (r.end <= r.begin) continue;
    if (!merged.empty() && r.begin < merged.back().end)
      return Status::Internal("the ranges declared for '" + path + "' overlap at byte " + std::to_string(r.begin));
    if (!merged.empty() && r.begin == merged.back().end) merged.back().end = r.end;
    else merged.push_back(r);
  }
  return std::unique_ptr<WriteBlocks>(new WriteBlocks(pool, group, std::move(merged), std::move(write), std::move(path)));
}

WriteBlocks::WriteBlocks(WritePool& pool, WriteGroup& group, std::vector<ByteRange> expected, Write write, std::string path)
    : pool_(pool), group_(group), expected_(std::move(expected)), write_(std::move(write)), path_(std::move(path)), r_(pool.request_bytes()) {
  complete_.assign(expected_.empty() ? 0 : static_cast<size_t>((expected_.back().end + r_ - 1) / r_), false);
  pool_.add_holder(this);
}

WriteBlocks::~WriteBlocks() {
  pool_.remove_holder(this);
  for (auto& kv : blocks_) pool_.give_back(kv.second.buf);
}

WriteBlocks::Cover WriteBlocks::covers(uint64_t off, uint64_t n) const {
  auto it = std::upper_bound(expected_.begin(), expected_.end(), off, [](uint64_t x, const ByteRange& r) { return x < r.end; });
  if (it == expected_.end() || it->begin >= off + n) return Cover::kOutside;
  return it->begin <= off && off + n <= it->end ? Cover::kInside : Cover::kPartly;
}

Result<bool> WriteBlocks::gathers(uint64_t off, uint64_t n, const char* what) const {
  const Cover c = n ? covers(off, n) : Cover::kOutside;
  if (c == Cover::kPartly)
    return Status::Internal(std::string("a ") + what + " of bytes [" + std::to_string(off) + ", " + std::to_string(off + n) + ") of '" +
                            path_ + "' crosses the edge of the ranges its writer declared");
  return c == Cover::kInside;
}

uint64_t WriteBlocks::expected_in(uint64_t block) const {
  const uint64_t a = block * r_, e = a + r_;
  uint64_t n = 0;
  auto it = std::upper_bound(expected_.begin(), expected_.end(), a, [](uint64_t x, const ByteRange& r) { return x < r.end; });
  for (; it != expected_.end() && it->begin < e; ++it) n += std::min(e, it->end) - std::max(a, it->begin);
  return n;
}

std::map<uint64_t, WriteBlocks::Block>::iterator WriteBlocks::block_at(uint64_t k) {
  auto it = blocks_.find(k);
  if (it != blocks_.end()) return it;
  Block b;
  b.expected = expected_in(k);
  return blocks_.emplace(k, std::move(b)).first;
}

Status WriteBlocks::range_error(const char* what, uint64_t a, uint64_t b) const {
  return Status::Internal("bytes [" + std::to_string(a) + ", " + std::to_string(b) + ") of '" + path_ + "' " + what);
}

Result<WriteBlocks::Slice> WriteBlocks::open(uint64_t off) {
  if (covers(off, 1) != Cover::kInside) return range_error("are outside the ranges its writer declared", off, off + 1);
  const uint64_t k = off / r_;
  std::unique_lock<std::mutex> l(mu_);
  if (complete_[k]) return range_error("were written twice", off, off + 1);
  for (;;) {
    auto it = block_at(k);
    Block& b = it->second;
    if (b.buf) {
      ++b.writers;
      b.touched = ++seq_;
      return Slice{b.buf + (off - k * r_), off, (k + 1) * r_ - off};
    }
    l.unlock();
    char* buf = pool_.acquire();  // may wait: this thread holds no slice
    l.lock();
    if (!buf) return Status::Io("cannot allocate a write buffer writing '" + path_ + "'");
    it = blocks_.find(k);
    if (it == blocks_.end() || it->second.buf) {  // completed (an error shows at fill) or given one meanwhile
      l.unlock();
      pool_.give_back(buf);
      l.lock();
      if (complete_[k]) return range_error("were written twice", off, off + 1);
      continue;
    }
    it->second.buf = buf;
  }
}

Status WriteBlocks::add_filled(uint64_t k, Block& b, uint64_t a, uint64_t e, bool in_buffer, Out& out) {
  if (a == e) return Status::Ok();
  if (covers(a, e - a) != Cover::kInside) return range_error("are outside the ranges its writer declared", a, e);
  if (!add_range(b.filled, a, e)) return range_error("were written twice", a, e);
  if (in_buffer) (void)add_range(b.unsent, a, e);
  b.got += e - a;
  if (b.got < b.expected) return Status::Ok();
  out = Out{b.buf, k * r_, std::move(b.unsent)};
  complete_[k] = true;
  blocks_.erase(k);
  return Status::Ok();
}

Status WriteBlocks::fill(const Slice& s, uint64_t k) {
  Out out;
  Status st;
  {
    std::lock_guard<std::mutex> l(mu_);
    const uint64_t idx = s.off / r_;
    auto it = blocks_.find(idx);
    if (k == 0 && (it == blocks_.end() || it->second.buf == nullptr)) return Status::Ok();  // a dropped slice of a block gone
    if (it == blocks_.end() || it->second.buf == nullptr || it->second.writers <= 0)
      return Status::Internal("a write slice of '" + path_ + "' filled after its block left");
    Block& b = it->second;
    --b.writers;
    st = add_filled(idx, b, s.off, s.off + std::min(k, s.n), /*in_buffer=*/true, out);
  }
  send(std::move(out));
  return st;
}

Status WriteBlocks::external(uint64_t off, uint64_t n) {
  for (uint64_t a = off, e = off + n; a < e;) {
    const uint64_t k = a / r_, stop = std::min(e, (k + 1) * r_);
    Out out;
    Status st;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (k >= complete_.size() || complete_[k]) return range_error("were written twice, or outside the declared ranges", a, stop);
      auto it = block_at(k);
      st = add_filled(k, it->second, a, stop, /*in_buffer=*/false, out);
    }
    send(std::move(out));
    CKPT_RETURN_IF_ERROR(st);
    a = stop;
  }
  return Status::Ok();
}

void WriteBlocks::send(Out o) {
  if (!o.buf) return;
  if (o.ranges.empty()) {
    pool_.give_back(o.buf);
    return;
  }
  uint64_t bytes = 0;
  for (const ByteRange& r : o.ranges) bytes += r.end - r.begin;
  // the write function copied: a write may still run after this object is gone (its file waits for it)
  pool_.submit(group_, o.buf, bytes, [w = write_, o = std::move(o)](WritePool::Route route) { return w(route, o.buf, o.base, o.ranges); });
}

bool WriteBlocks::release_one() {
  Out out;
  {
    std::lock_guard<std::mutex> l(mu_);
    Block* pick = nullptr;
    uint64_t k = 0;
    for (auto& kv : blocks_)
      if (kv.second.buf && kv.second.writers == 0 && (!pick || kv.second.touched < pick->touched)) {
        pick = &kv.second;
        k = kv.first;
      }
    if (!pick) return false;
    out = Out{pick->buf, k * r_, std::move(pick->unsent)};
    pick->buf = nullptr;
    pick->unsent.clear();
  }
  send(std::move(out));
  return true;
}

Status WriteBlocks::flush() {
  std::vector<Out> outs;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& [k, b] : blocks_) {
      if (b.writers > 0) return Status::Internal("'" + path_ + "' flushed while a copy fills it");
      if (!b.buf) continue;
      outs.push_back(Out{b.buf, k * r_, std::move(b.unsent)});
      b.buf = nullptr;
      b.unsent.clear();
    }
  }
  for (Out& o : outs) send(std::move(o));
  return Status::Ok();
}

}  // namespace ckpt
