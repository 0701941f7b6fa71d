// SourceWindow (formats/io/source_window.h) in every I/O mode against a naive reference (pread of
// the same bytes): reads at any offset and length (unaligned heads and tails, a file whose size is
// not a multiple of the block, reads crossing windows, forward and jumping back), with windows of
// one block to several MiB; the kAuto rule (mapped when resident, direct when not); reads past
// the end ("ShortSource"); read_file_blocks_io in every mode. O_DIRECT reads of pages still dirty
// in the page cache (written, never synced) see the written bytes.
#include "formats/io/source_window.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "formats/base/file_io.h"
#include "tests/direct_reads_probe.h"

namespace ckpt {
namespace {

std::string srcwin_temp(const std::string& tag) {
  return (std::filesystem::temp_directory_path() / ("ckpt_srcwin_" + tag + "_" + std::to_string(::getpid()))).string();
}

struct SrcWinFile {
  std::string path;
  ScopedFd fd;
  std::vector<uint8_t> bytes;
  SrcWinFile(const std::string& tag, size_t n, uint64_t seed) : path(srcwin_temp(tag)) {
    std::mt19937_64 rng(seed);
    bytes.resize(n);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    fd = std::move(open_fd(path, O_RDWR | O_CREAT | O_TRUNC, "create").value());
    EXPECT_TRUE(pwrite_full(fd.get(), bytes.data(), bytes.size(), 0, path).ok());  // not synced: dirty pages
  }
  ~SrcWinFile() { std::filesystem::remove(path); }
  bool direct_ok() const { return testing::direct_reads_ok(path); }  // tests/direct_reads_probe.h
  void drop_cache() const {
    ASSERT_EQ(::fsync(fd.get()), 0);
    (void)::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);
  }
};

// Bytes [off, off + n) through `w`, span by span.
std::vector<uint8_t> srcwin_get(SourceWindow& w, uint64_t off, uint64_t n, bool* direct_seen) {
  std::vector<uint8_t> out;
  while (out.size() < n) {
    auto sp = w.at(off + out.size(), n - out.size(), "test");
    EXPECT_TRUE(sp.ok()) << sp.status().message();
    if (!sp.ok() || !sp->p || sp->n == 0) return out;
    *direct_seen = *direct_seen || w.last_was_direct();
    out.insert(out.end(), reinterpret_cast<const uint8_t*>(sp->p), reinterpret_cast<const uint8_t*>(sp->p) + sp->n);
  }
  return out;
}

TEST(SourceWindow, MatchesPreadAtAnyOffsetAndLengthInEveryMode) {
  SrcWinFile f("any", (9u << 20) + 777, 21);
  const uint64_t size = f.bytes.size();
  std::mt19937_64 rng(22);
  for (IoMode mode : {IoMode::kBuffered, IoMode::kDirect, IoMode::kAuto}) {
    for (uint64_t window : {uint64_t{4096}, uint64_t{1} << 20, uint64_t{3} << 20}) {
      if (mode == IoMode::kAuto) f.drop_cache();  // cold: auto reads direct
      SourceWindow w(f.fd.get(), mode, window);
      ASSERT_TRUE(w.init("test").ok());
      bool direct_seen = false;
      uint64_t pos = 0;
      for (int i = 0; i < 60; ++i) {
        // Mostly forward (a gather), sometimes a jump back or ahead; lengths from 1 byte to 5 MiB.
        const uint64_t off = (i % 7 == 6) ? rng() % size : std::min(pos + rng() % 9000, size - 1);
        const uint64_t maxn = (i % 5 == 0) ? (5u << 20) : (i % 3 == 0 ? 4096 : 1 + rng() % 70000);
        const uint64_t n = std::min<uint64_t>(1 + rng() % maxn, size - off);
        std::vector<uint8_t> want(f.bytes.begin() + static_cast<long>(off), f.bytes.begin() + static_cast<long>(off + n));
        ASSERT_TRUE(srcwin_get(w, off, n, &direct_seen) == want) << io_mode_name(mode) << " window " << window << " off " << off << " n " << n;
        pos = off + n;
      }
      auto tail = srcwin_get(w, size - 1, 1, &direct_seen);
      ASSERT_EQ(tail.size(), 1u);
      EXPECT_EQ(tail[0], f.bytes.back());
      if (mode == IoMode::kBuffered) {
        EXPECT_FALSE(direct_seen);
      }
      if (mode == IoMode::kDirect && f.direct_ok()) {
        EXPECT_TRUE(direct_seen) << "window " << window;
      }
    }
  }
}

TEST(SourceWindow, AutoMapsResidentWindowsAndReadsColdOnesDirect) {
  SrcWinFile f("auto", 6u << 20, 23);
  if (!f.direct_ok()) GTEST_SKIP() << "no O_DIRECT reads on " << f.path;
  {
    SourceWindow w(f.fd.get(), IoMode::kAuto, 1 << 20);
    ASSERT_TRUE(w.init("test").ok());
    bool direct_seen = false;
    EXPECT_TRUE(srcwin_get(w, 123, 3u << 20, &direct_seen) == std::vector<uint8_t>(f.bytes.begin() + 123, f.bytes.begin() + 123 + (3 << 20)));
    EXPECT_FALSE(direct_seen);  // just written: in the page cache
  }
  f.drop_cache();
  SourceWindow w(f.fd.get(), IoMode::kAuto, 1 << 20);
  ASSERT_TRUE(w.init("test").ok());
  bool direct_seen = false;
  EXPECT_TRUE(srcwin_get(w, 5000, 4u << 20, &direct_seen) == std::vector<uint8_t>(f.bytes.begin() + 5000, f.bytes.begin() + 5000 + (4 << 20)));
  EXPECT_TRUE(direct_seen);
}

TEST(SourceWindow, PastTheEndIsShortSource) {
  SrcWinFile f("short", 10000, 24);
  for (IoMode mode : {IoMode::kBuffered, IoMode::kDirect, IoMode::kAuto}) {
    SourceWindow w(f.fd.get(), mode, 1 << 20);
    ASSERT_TRUE(w.init("out.bin").ok());
    auto sp = w.at(9000, 1001, "out.bin");
    ASSERT_FALSE(sp.ok());
    EXPECT_EQ(sp.status().code(), "ShortSource");
    EXPECT_NE(sp.status().message().find("out.bin"), std::string::npos);
    auto ok = w.at(9000, 1000, "out.bin");
    ASSERT_TRUE(ok.ok());
    ASSERT_NE(ok->p, nullptr);
    EXPECT_EQ(ok->n, 1000u);
    EXPECT_EQ(std::memcmp(ok->p, f.bytes.data() + 9000, 1000), 0);
  }
}

TEST(SourceWindow, ReadFileBlocksIoSeesTheRangeInOrderInEveryMode) {
  SrcWinFile f("blocks", (5u << 20) + 4097, 25);
  std::mt19937_64 rng(26);
  for (IoMode mode : {IoMode::kBuffered, IoMode::kDirect, IoMode::kAuto}) {
    for (int i = 0; i < 6; ++i) {
      if (i % 2 == 1) f.drop_cache();
      const uint64_t off = i == 0 ? 0 : rng() % 100000;
      const uint64_t n = i == 0 ? f.bytes.size() : rng() % (f.bytes.size() - off);
      std::vector<uint8_t> seen;
      ASSERT_TRUE(read_file_blocks_io(f.fd.get(), off, n, mode, f.path, [&](const void* p, size_t k) {
        seen.insert(seen.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + k);
      }).ok());
      EXPECT_TRUE(seen == std::vector<uint8_t>(f.bytes.begin() + static_cast<long>(off), f.bytes.begin() + static_cast<long>(off + n)))
          << io_mode_name(mode) << " " << off << "+" << n;
    }
  }
}

}  // namespace
}  // namespace ckpt
