// OutputFile in each I/O mode against a naive reference (a byte vector the same writes land in):
// writes at any alignment and size (unaligned heads and tails, writes under one block, writes
// larger than the staging buffer), gathers of file ranges from several sources (runs smaller
// than a block, runs crossing the mapping window), the block callback, short sources, a write failing behind the copy, and the
// mode parser and auto rule. (The fallback where O_DIRECT is refused: tests/python/test_direct_io.py.)
#include "formats/io/output_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "formats/base/file_io.h"

namespace ckpt {
namespace {

std::string dio_temp(const std::string& tag) {
  return (std::filesystem::temp_directory_path() / ("ckpt_dio_" + tag + "_" + std::to_string(::getpid()))).string();
}

std::vector<uint8_t> dio_random(size_t n, std::mt19937_64& rng) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

std::vector<uint8_t> dio_read(const std::string& path) {
  std::vector<uint8_t> v(static_cast<size_t>(std::filesystem::file_size(path)));
  ScopedFd fd = std::move(open_fd(path, O_RDONLY, "open").value());
  EXPECT_TRUE(pread_full(fd.get(), v.data(), v.size(), 0, path).ok());
  return v;
}

TEST(IoMode, ParsesNamesAndResolvesAutoBySize) {
  EXPECT_EQ(parse_io_mode("direct", "--io").value(), IoMode::kDirect);
  EXPECT_EQ(parse_io_mode("buffered", "--io").value(), IoMode::kBuffered);
  EXPECT_EQ(parse_io_mode("auto", "--io").value(), IoMode::kAuto);
  auto bad = parse_io_mode("fast", "--io");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--io 'fast'"), std::string::npos);
  EXPECT_EQ(resolve_io_mode(IoMode::kAuto, kAutoDirectMinBytes - 1), IoMode::kBuffered);
  EXPECT_EQ(resolve_io_mode(IoMode::kAuto, kAutoDirectMinBytes), IoMode::kDirect);
  EXPECT_EQ(resolve_io_mode(IoMode::kBuffered, 1ull << 40), IoMode::kBuffered);
  EXPECT_EQ(resolve_io_mode(IoMode::kDirect, 1), IoMode::kDirect);
}

// Random writes (disjoint, any order) give the reference bytes in both modes.
TEST(OutputFile, WritesMatchReferenceInEveryMode) {
  std::mt19937_64 rng(11);
  const size_t size = (9u << 20) + 12345;  // more than two 4 MiB staging buffers
  const auto data = dio_random(size, rng);
  std::vector<uint64_t> cuts{0, size, 1, 4095, 4096, 4097, 8192 + 17, 20000};
  for (int i = 0; i < 40; ++i) cuts.push_back(rng() % size);
  cuts.push_back((4u << 20) + 4096 * 3);
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  std::vector<size_t> order(cuts.size() - 1);
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  for (IoMode mode : {IoMode::kBuffered, IoMode::kDirect}) {
    const std::string path = dio_temp(io_mode_name(mode));
    auto f = OutputFile::open(path, O_WRONLY | O_CREAT | O_TRUNC, mode, size);
    ASSERT_TRUE(f.ok()) << f.status().message();
    if (mode == IoMode::kBuffered) {
      EXPECT_FALSE(f->direct());
    }
    for (size_t i : order) ASSERT_TRUE(f->write(data.data() + cuts[i], cuts[i + 1] - cuts[i], cuts[i]).ok());
    ASSERT_TRUE(f->close().ok());
    EXPECT_TRUE(dio_read(path) == data) << io_mode_name(mode);
    std::filesystem::remove(path);
  }
}

// Writes from memory at the file offset's 4 KiB phase (the chunks the executor places so,
// formats/tensor/write_placement.h): the direct path takes their aligned middles without the staging
// copy; heads, tails, writes under a block and more than a staging buffer give the same bytes.
TEST(OutputFile, WritesFromMemoryAtTheFilePhaseMatchReference) {
  std::mt19937_64 rng(12);
  const size_t size = (9u << 20) + 777;
  const auto data = dio_random(size, rng);
  void* mem = nullptr;
  ASSERT_EQ(::posix_memalign(&mem, kDirectAlignBytes, size), 0);
  std::unique_ptr<uint8_t, void (*)(void*)> placed(static_cast<uint8_t*>(mem), std::free);
  std::memcpy(placed.get(), data.data(), size);  // byte o at an address = o modulo 4 KiB
  const std::vector<uint64_t> cuts{0, 100, 4096, 4096 * 3 + 5, (5u << 20) + 1, (5u << 20) + 2000, size};
  for (IoMode mode : {IoMode::kBuffered, IoMode::kDirect}) {
    const std::string path = dio_temp(std::string("placed_") + io_mode_name(mode));
    auto f = OutputFile::open(path, O_WRONLY | O_CREAT | O_TRUNC, mode, size);
    ASSERT_TRUE(f.ok()) << f.status().message();
    for (size_t i = cuts.size() - 1; i-- > 0;)  // back to front
      ASSERT_TRUE(f->write(placed.get() + cuts[i], cuts[i + 1] - cuts[i], cuts[i]).ok());
    ASSERT_TRUE(f->close().ok());
    EXPECT_TRUE(dio_read(path) == data) << io_mode_name(mode);
    std::filesystem::remove(path);
  }
}

// Gathers of runs from three source files (runs of a few bytes to 10 MiB, unaligned offsets on
// both sides) equal the naive concatenation; the callback sees exactly those bytes in order.
TEST(OutputFile, CopyRunsGathersSourcesInOrder) {
  std::mt19937_64 rng(12);
  std::vector<std::vector<uint8_t>> srcs;
  std::vector<ScopedFd> fds;
  std::vector<std::string> names;
  for (int k = 0; k < 3; ++k) {
    srcs.push_back(dio_random((12u << 20) + 1000u * static_cast<unsigned>(k), rng));
    names.push_back(dio_temp("src" + std::to_string(k)));
    fds.push_back(std::move(open_fd(names.back(), O_RDWR | O_CREAT | O_TRUNC, "create").value()));
    ASSERT_TRUE(pwrite_full(fds.back().get(), srcs.back().data(), srcs.back().size(), 0, names.back()).ok());
  }
  for (IoMode mode : {IoMode::kBuffered, IoMode::kDirect}) {
    for (int trial = 0; trial < 4; ++trial) {
      std::vector<FileExtent> runs;
      std::vector<uint8_t> want;
      const int nruns = trial == 0 ? 1 : 1 + static_cast<int>(rng() % 300);
      for (int r = 0; r < nruns; ++r) {
        const size_t k = rng() % 3;
        const uint64_t n = trial == 0 ? (10u << 20) + 3 : (r % 50 == 0 ? rng() % (3u << 20) : 1 + rng() % 5000);
        const uint64_t off = rng() % (srcs[k].size() - n);
        runs.push_back({fds[k].get(), off, n});
        want.insert(want.end(), srcs[k].begin() + static_cast<long>(off), srcs[k].begin() + static_cast<long>(off + n));
      }
      const uint64_t at = trial == 1 ? 0 : rng() % 10000;
      const std::string path = dio_temp("gather");
      auto f = OutputFile::open(path, O_WRONLY | O_CREAT | O_TRUNC, mode, at + want.size());
      ASSERT_TRUE(f.ok());
      std::vector<uint8_t> seen;
      ASSERT_TRUE(f->copy_runs(runs, at, [&](const void* p, size_t n) {
        seen.insert(seen.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
      }).ok());
      ASSERT_TRUE(f->close().ok());
      auto got = dio_read(path);
      ASSERT_EQ(got.size(), at + want.size());
      EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin() + static_cast<long>(at))) << io_mode_name(mode) << " trial " << trial;
      EXPECT_TRUE(seen == want);
      std::filesystem::remove(path);
    }
  }
  for (const auto& n : names) std::filesystem::remove(n);
}

TEST(OutputFile, CopyRunsPastTheEndOfASourceIsShortSource) {
  const std::string src = dio_temp("short");
  ScopedFd fd = std::move(open_fd(src, O_RDWR | O_CREAT | O_TRUNC, "create").value());
  std::vector<uint8_t> bytes(10000, 7);
  ASSERT_TRUE(pwrite_full(fd.get(), bytes.data(), bytes.size(), 0, src).ok());
  for (IoMode mode : {IoMode::kBuffered, IoMode::kDirect}) {
    const std::string path = dio_temp("short_out");
    auto f = OutputFile::open(path, O_WRONLY | O_CREAT | O_TRUNC, mode, 1 << 20);
    ASSERT_TRUE(f.ok());
    Status st = f->copy_runs({{fd.get(), 0, 5000}, {fd.get(), 9000, 5000}}, 0);
    EXPECT_EQ(st.code(), "ShortSource") << st.message();
    EXPECT_NE(st.message().find(path), std::string::npos);
    std::filesystem::remove(path);
  }
  std::filesystem::remove(src);
}

// copy_runs writes one half stage while it fills the other: a write that fails there is still the
// call's error (naming the file), and the call returns only after its last write.
TEST(OutputFile, CopyRunsReturnsAFailedWriteBehindTheCopy) {
  const std::string src = dio_temp("wfail");
  ScopedFd fd = std::move(open_fd(src, O_RDWR | O_CREAT | O_TRUNC, "create").value());
  std::vector<uint8_t> bytes(9u << 20, 5);
  ASSERT_TRUE(pwrite_full(fd.get(), bytes.data(), bytes.size(), 0, src).ok());
  for (IoMode mode : {IoMode::kBuffered, IoMode::kDirect}) {
    auto f = OutputFile::open("/dev/full", O_WRONLY, mode, bytes.size());  // every write: ENOSPC
    ASSERT_TRUE(f.ok()) << f.status().message();
    Status st = f->copy_runs({{fd.get(), 0, 4u << 20}, {fd.get(), 4u << 20, 5u << 20}}, 0);
    EXPECT_FALSE(st.ok()) << io_mode_name(mode);
    EXPECT_NE(st.message().find("/dev/full"), std::string::npos) << st.message();
  }
  std::filesystem::remove(src);
}

}  // namespace
}  // namespace ckpt
