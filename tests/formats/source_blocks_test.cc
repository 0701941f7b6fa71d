// SourceBlocks (formats/io/source_blocks.h) against a naive reference (the bytes written to the
// files): reads in any order of sizes across block boundaries and files, several threads at once,
// a capacity far smaller than the files and the read-ahead (never more blocks held; no block read
// twice when each byte is taken once), reading back over freed blocks, files that end early
// ("ShortSource") and descriptors that cannot be read direct (no block: the caller reads its way);
// a BlockTap sees its ranges' bytes in order and equal to the file's, and a range one of whose
// blocks went before its turn is fed a true prefix only, going on when the block is read again;
// what the tap has seen is read once the SourceBlocks is gone (readers may feed after a copy returns).
#include "formats/io/source_blocks.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "formats/base/file_io.h"
#include "tests/direct_reads_probe.h"

namespace ckpt {
namespace {

struct BlocksFile {
  std::string path;
  ScopedFd fd;
  std::vector<uint8_t> bytes;
  BlocksFile(const std::string& tag, size_t n, uint64_t seed)
      : path((std::filesystem::temp_directory_path() / ("ckpt_blocks_" + tag + "_" + std::to_string(::getpid()))).string()) {
    std::mt19937_64 rng(seed);
    bytes.resize(n);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    fd = std::move(open_fd(path, O_RDWR | O_CREAT | O_TRUNC, "create").value());
    EXPECT_TRUE(pwrite_full(fd.get(), bytes.data(), bytes.size(), 0, path).ok());
    EXPECT_EQ(::fsync(fd.get()), 0);
  }
  ~BlocksFile() { std::filesystem::remove(path); }
};

bool direct_reads_ok(const BlocksFile& f) { return testing::direct_reads_ok(f.path); }

// Bytes [off, off + n) of `f` through `sb`, lease by lease, each lease taken in steps of `step`.
std::vector<uint8_t> take(SourceBlocks& sb, const BlocksFile& f, uint64_t off, uint64_t n, uint64_t step = UINT64_MAX) {
  std::vector<uint8_t> out;
  while (out.size() < n) {
    const uint64_t at = off + out.size();
    auto l = sb.get(f.fd.get(), at, n - out.size(), UINT64_MAX, "test");
    EXPECT_TRUE(l.ok()) << l.status().message();
    if (!l.ok() || !l->p) return out;
    const uint64_t k = std::min({l->n, n - out.size(), step});
    out.insert(out.end(), l->p, l->p + k);
    sb.release(*l, k);
  }
  return out;
}

std::vector<uint8_t> slice(const BlocksFile& f, uint64_t off, uint64_t n) {
  return {f.bytes.begin() + static_cast<long>(off), f.bytes.begin() + static_cast<long>(off + n)};
}

TEST(SourceBlocks, FilesReadInterleavedMatchTheirBytesAndEachBlockIsReadOnce) {
  BlocksFile a("a", (20u << 20) + 123, 1), b("b", (9u << 20) + 7, 2), c("c", 17u << 20, 3);
  ASSERT_TRUE(direct_reads_ok(a));
  SourceBlocks sb(32u << 20, 2);
  std::mt19937_64 rng(7);
  std::vector<const BlocksFile*> files{&a, &b, &c};
  std::vector<uint64_t> at(3, 0);
  std::vector<std::vector<uint8_t>> got(3);
  for (bool more = true; more;) {  // round robin, random run lengths, as a gather of tp ranks reads
    more = false;
    for (size_t i = 0; i < files.size(); ++i) {
      const uint64_t left = files[i]->bytes.size() - at[i];
      if (left == 0) continue;
      const uint64_t n = std::min<uint64_t>(left, 1 + rng() % (3u << 20));
      auto part = take(sb, *files[i], at[i], n, 1 + rng() % (1u << 20));
      got[i].insert(got[i].end(), part.begin(), part.end());
      at[i] += n;
      more = true;
    }
  }
  for (size_t i = 0; i < files.size(); ++i) EXPECT_TRUE(got[i] == files[i]->bytes) << "file " << i;
  const SourceBlocks::Stats st = sb.stats();
  // ceil(size / 8 MiB) blocks each, every byte taken once: a block is read again only when it
  // was read ahead and freed for a demand before anyone asked for it (never one being read through).
  EXPECT_EQ(st.blocks_read, 3u + 2u + 3u + st.evicted_unused);
  EXPECT_LE(st.peak_blocks, 4u);
}

TEST(SourceBlocks, CapacityBelowTheReadAheadOfManyFilesHoldsAndReadsRight) {
  std::vector<std::unique_ptr<BlocksFile>> files;
  for (int i = 0; i < 6; ++i) files.push_back(std::make_unique<BlocksFile>("m" + std::to_string(i), (11u << 20) + 4096u * i + 5, 10 + i));
  ASSERT_TRUE(direct_reads_ok(*files[0]));
  SourceBlocks sb(4 * kSourceBlockBytes, 8);  // 4 blocks; 6 files x 8 blocks of read-ahead asked for
  std::vector<uint64_t> at(files.size(), 0);
  for (bool more = true; more;) {
    more = false;
    for (size_t i = 0; i < files.size(); ++i) {
      const uint64_t left = files[i]->bytes.size() - at[i];
      if (left == 0) continue;
      const uint64_t n = std::min<uint64_t>(left, 700u << 10);
      EXPECT_TRUE(take(sb, *files[i], at[i], n) == slice(*files[i], at[i], n)) << "file " << i << " at " << at[i];
      at[i] += n;
      more = true;
    }
  }
  EXPECT_LE(sb.stats().peak_blocks, 4u);
}

TEST(SourceBlocks, ThreadsReadingTheSameAndOtherFilesAtOnce) {
  BlocksFile a("ta", (30u << 20) + 999, 21), b("tb", (25u << 20) + 1, 22);
  ASSERT_TRUE(direct_reads_ok(a));
  SourceBlocks sb(48u << 20, 4);
  const uint64_t half = a.bytes.size() / 2;
  bool ok[4] = {false, false, false, false};
  std::vector<std::thread> th;
  th.emplace_back([&] { ok[0] = take(sb, a, 0, half, 65536) == slice(a, 0, half); });
  th.emplace_back([&] { ok[1] = take(sb, a, half, a.bytes.size() - half, 100000) == slice(a, half, a.bytes.size() - half); });
  th.emplace_back([&] { ok[2] = take(sb, b, 0, b.bytes.size()) == b.bytes; });
  th.emplace_back([&] { ok[3] = take(sb, b, 4097, 5u << 20, 4096) == slice(b, 4097, 5u << 20); });  // bytes taken twice: read again if freed
  for (auto& t : th) t.join();
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(ok[i]) << "thread " << i;
  EXPECT_LE(sb.stats().peak_blocks, 6u);
}

TEST(SourceBlocks, BytesAskedForAgainAfterTheirBlockWasFreedAreReadAgain) {
  BlocksFile a("back", (12u << 20) + 3, 31);
  ASSERT_TRUE(direct_reads_ok(a));
  SourceBlocks sb(4 * kSourceBlockBytes, 1);
  EXPECT_TRUE(take(sb, a, 0, a.bytes.size()) == a.bytes);
  EXPECT_TRUE(take(sb, a, 100, 9u << 20) == slice(a, 100, 9u << 20));  // back to the start
  EXPECT_GE(sb.stats().blocks_read, 4u);
}

TEST(SourceBlocks, AskingPastTheEndIsShortSource) {
  BlocksFile a("short", (8u << 20) + 10, 41);
  ASSERT_TRUE(direct_reads_ok(a));
  SourceBlocks sb(32u << 20, 2);
  auto l = sb.get(a.fd.get(), (8u << 20) + 5, 6, UINT64_MAX, "out.h5");
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), "ShortSource");
  EXPECT_NE(l.status().message().find("out.h5"), std::string::npos);
  EXPECT_NE(l.status().message().find(std::to_string((8u << 20) + 10)), std::string::npos);  // the file's size
  auto last = sb.get(a.fd.get(), (8u << 20) + 5, 5, UINT64_MAX, "out.h5");  // the last bytes are there
  ASSERT_TRUE(last.ok());
  ASSERT_NE(last->p, nullptr);
  EXPECT_EQ(last->n, 5u);
  const auto* q = reinterpret_cast<const uint8_t*>(last->p);
  EXPECT_TRUE(std::equal(q, q + 5, a.bytes.end() - 5));
  sb.release(*last, 5);
}

TEST(SourceBlocks, ADescriptorThatCannotBeReadDirectGivesNoBlock) {
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  SourceBlocks sb(32u << 20, 2);
  auto l = sb.get(p[0], 0, 0, UINT64_MAX, "pipe");
  ASSERT_TRUE(l.ok()) << l.status().message();
  EXPECT_EQ(l->p, nullptr);
  ::close(p[0]);
  ::close(p[1]);
}

// Records what it is fed per range, failing on bytes out of order.
struct RecordingTap : BlockTap {
  std::vector<Range> want;
  std::mutex mu;
  std::map<uint64_t, std::vector<uint8_t>> seen;
  std::vector<Range> ranges(uint64_t, uint64_t) override { return want; }
  void feed(uint64_t id, uint64_t off, const char* p, uint64_t n) override {
    std::lock_guard<std::mutex> l(mu);
    auto& v = seen[id];
    EXPECT_EQ(off, want[id].off + v.size()) << "range " << id << " fed out of order";
    v.insert(v.end(), p, p + n);
  }
};

TEST(SourceBlocks, TapSeesEveryRangeInOrderFromReadsDoneOnce) {
  BlocksFile a("tap", (40u << 20) + 4321, 11);
  ASSERT_TRUE(direct_reads_ok(a));
  auto tap = std::make_shared<RecordingTap>();  // ranges across block edges, one inside a block, one to the end
  tap->want = {{0, 100, (5u << 20)}, {1, (5u << 20) + 200, (25u << 20)}, {2, (31u << 20), 1000}, {3, (33u << 20), a.bytes.size() - (33u << 20)}};
  auto sb = std::make_unique<SourceBlocks>(24u << 20, 3);  // 3 blocks of room for a 6-block file
  sb->set_tap(tap);
  std::thread t([&] { EXPECT_EQ(take(*sb, a, 20u << 20, a.bytes.size() - (20u << 20), 777777), slice(a, 20u << 20, a.bytes.size() - (20u << 20))); });
  EXPECT_EQ(take(*sb, a, 0, 20u << 20, 999999), slice(a, 0, 20u << 20));  // two copies at two places of the file
  t.join();
  // The copies are done, but a reader thread may still be feeding a block they took (get() returns
  // once the block is ready, while its reader feeds the tap): read `seen` only once the readers are
  // joined. (Before, `seen` was read here while a feed appended to it: range 1 looked wrong, ~1 run in 10.)
  sb.reset();
  for (const auto& r : tap->want) {
    const auto& v = tap->seen[r.id];
    ASSERT_LE(v.size(), r.bytes) << "range " << r.id;
    EXPECT_EQ(v, slice(a, r.off, v.size())) << "range " << r.id;
    if (r.id != 1) {
      EXPECT_EQ(v.size(), r.bytes) << "range " << r.id << " lies in one copy's bytes: fed whole";
    }
  }
}

// Two tapped ranges in one read-ahead block; while the tap is fed the first (on the reader thread,
// no lock held), a copy takes the whole block and lets it go. The block must stay until the tap has
// been fed the second range too (it was freed after the first: a use-after-free, SIGSEGV under load).
struct GatedTap : RecordingTap {
  std::mutex gate_mu;
  std::condition_variable gate_cv;
  bool entered = false, open = false;
  void feed(uint64_t id, uint64_t off, const char* p, uint64_t n) override {
    if (id == 0) {
      std::unique_lock<std::mutex> l(gate_mu);
      entered = true;
      gate_cv.notify_all();
      gate_cv.wait(l, [this] { return open; });
    }
    RecordingTap::feed(id, off, p, n);
  }
};

TEST(SourceBlocks, BlockTakenWholeWhileTheTapFeedsStaysForItsNextRange) {
  constexpr uint64_t B = kSourceBlockBytes;
  BlocksFile a("tapgate", 2 * B, 13);
  ASSERT_TRUE(direct_reads_ok(a));
  auto tap = std::make_shared<GatedTap>();
  tap->want = {{0, B + 100, 1000}, {1, B + 5000, 7000}};  // both in block 1, read ahead by a reader thread
  SourceBlocks sb(4 * B, 1);
  sb.set_tap(tap);
  EXPECT_EQ(take(sb, a, 0, 10), slice(a, 0, 10));  // block 0 on demand; block 1 read ahead
  {
    std::unique_lock<std::mutex> l(tap->gate_mu);
    ASSERT_TRUE(tap->gate_cv.wait_for(l, std::chrono::seconds(30), [&] { return tap->entered; }));
  }
  EXPECT_EQ(take(sb, a, B, B), slice(a, B, B));  // block 1 taken whole while range 0 is being fed
  {
    std::lock_guard<std::mutex> l(tap->gate_mu);
    tap->open = true;
  }
  tap->gate_cv.notify_all();
  for (int i = 0; i < 3000; ++i) {  // the reader thread feeds range 1 after range 0
    {
      std::lock_guard<std::mutex> l(tap->mu);
      if (tap->seen[1].size() >= 7000) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::lock_guard<std::mutex> l(tap->mu);
  EXPECT_EQ(tap->seen[0], slice(a, B + 100, 1000));
  EXPECT_EQ(tap->seen[1], slice(a, B + 5000, 7000)) << "the block held for the tap's next range";
}

// A read-ahead block's reader feeds the tap after marking the block ready, without the lock: the
// copy that takes the block can return before the tap has seen its bytes. What a tap has seen is
// whole only once the SourceBlocks is gone (its destructor joins the readers). The check of
// TapSeesEveryRangeInOrderFromReadsDoneOnce read the tap right after the copies, while a reader
// still appended to it (range 1 "wrong" ~1 run in 10; every byte fed was right).
TEST(SourceBlocks, TapMayBeFedAfterTheCopyReturnsTillTheBlocksGo) {
  constexpr uint64_t B = kSourceBlockBytes;
  BlocksFile a("tapafter", 2 * B, 14);
  ASSERT_TRUE(direct_reads_ok(a));
  auto tap = std::make_shared<GatedTap>();
  tap->want = {{0, B + 100, 1000}};  // in block 1, read ahead by a reader thread
  auto sb = std::make_unique<SourceBlocks>(4 * B, 1);
  sb->set_tap(tap);
  EXPECT_EQ(take(*sb, a, 0, 10), slice(a, 0, 10));  // block 0 on demand; block 1 read ahead
  {
    std::unique_lock<std::mutex> l(tap->gate_mu);
    ASSERT_TRUE(tap->gate_cv.wait_for(l, std::chrono::seconds(30), [&] { return tap->entered; }));
  }
  EXPECT_EQ(take(*sb, a, B, B), slice(a, B, B));  // the copy of block 1 is done...
  {
    std::lock_guard<std::mutex> l(tap->mu);
    EXPECT_TRUE(tap->seen[0].empty()) << "...and its reader has not fed the tap yet";
  }
  std::atomic<bool> gone{false};
  std::thread closer([&] {
    sb.reset();
    gone = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(gone) << "the SourceBlocks went while its reader still fed the tap";
  {
    std::lock_guard<std::mutex> l(tap->gate_mu);
    tap->open = true;
  }
  tap->gate_cv.notify_all();
  closer.join();
  EXPECT_EQ(tap->seen[0], slice(a, B + 100, 1000));  // whole once the SourceBlocks is gone
}

TEST(SourceBlocks, TapRangeWhoseBlockWentEarlyGoesOnWhenItIsReadAgain) {
  BlocksFile a("tap2", 32u << 20, 12);
  ASSERT_TRUE(direct_reads_ok(a));
  auto tap = std::make_shared<RecordingTap>();
  tap->want = {{0, 1000, (30u << 20)}};
  SourceBlocks sb(32u << 20, 0);  // no read-ahead: blocks are read as asked
  sb.set_tap(tap);
  constexpr uint64_t B = kSourceBlockBytes;
  EXPECT_EQ(take(sb, a, 2 * B, B), slice(a, 2 * B, B));  // block 2 taken whole and freed before the range's turn
  EXPECT_EQ(take(sb, a, 3 * B, 100), slice(a, 3 * B, 100));  // block 3 held (not all taken)
  EXPECT_EQ(take(sb, a, 0, 2 * B), slice(a, 0, 2 * B));       // blocks 0, 1: fed; block 2 is gone
  EXPECT_EQ(tap->seen[0], slice(a, 1000, 2 * B - 1000));
  EXPECT_EQ(take(sb, a, 2 * B, B), slice(a, 2 * B, B));  // read again: fed, and block 3 (still held) after it
  EXPECT_EQ(tap->seen[0], slice(a, 1000, 30u << 20));
  EXPECT_EQ(sb.stats().blocks_read, 5u);
}

}  // namespace
}  // namespace ckpt
