// copy_file_bytes against a naive reference (the bytes written at the target offset, nothing
// else touched), the block callback, and every error path: short source, a source that shrinks
// while mapped (SIGBUS caught), a source that cannot be mapped (pipe); with_mapped_range likewise.
#include "formats/base/file_io.h"
#include "tests/test_cases.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace ckpt {
namespace {

struct TempFile {
  std::string path;
  int fd = -1;
  explicit TempFile(const std::string& tag) {
    path = (std::filesystem::temp_directory_path() / ("ckpt_fileio_" + tag + "_" + std::to_string(::getpid()))).string();
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  }
  ~TempFile() {
    if (fd >= 0) ::close(fd);
    std::filesystem::remove(path);
  }
  std::vector<uint8_t> contents() const {
    std::vector<uint8_t> v(static_cast<size_t>(std::filesystem::file_size(path)));
    EXPECT_EQ(::pread(fd, v.data(), v.size(), 0), static_cast<ssize_t>(v.size()));
    return v;
  }
};

std::vector<uint8_t> random_bytes(size_t n, std::mt19937_64& rng) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST(CopyFileBytes, MatchesNaiveCopyAtAnyAlignment) {
  std::mt19937_64 rng(5);
  TempFile src("src"), dst("dst");
  const auto data = random_bytes((21u << 20) + 777, rng);  // > two 8 MiB windows
  ASSERT_TRUE(pwrite_full(src.fd, data.data(), data.size(), 0, src.path).ok());
  const int trials = ckpt::testing::property_cases(8, 32, 3);
  for (int trial = 0; trial < trials; ++trial) {
    const uint64_t in_off = trial == 0 ? 0 : rng() % 9000;
    const uint64_t out_off = trial == 0 ? 0 : rng() % 9000;
    const uint64_t n = trial < 2 ? data.size() - in_off : rng() % (data.size() - in_off);
    auto before = random_bytes(out_off + n + 100, rng);
    ASSERT_EQ(::ftruncate(dst.fd, 0), 0);
    ASSERT_TRUE(pwrite_full(dst.fd, before.data(), before.size(), 0, dst.path).ok());
    std::vector<uint8_t> seen;
    size_t max_block = 0;
    Status st = copy_file_bytes(src.fd, in_off, dst.fd, out_off, n, dst.path, [&](const void* p, size_t k) {
      seen.insert(seen.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + k);
      max_block = std::max(max_block, k);
    });
    ASSERT_TRUE(st.ok()) << st.to_string();
    auto want = before;
    std::copy(data.begin() + static_cast<long>(in_off), data.begin() + static_cast<long>(in_off + n), want.begin() + static_cast<long>(out_off));
    ASSERT_EQ(dst.contents(), want) << "in_off " << in_off << " out_off " << out_off << " n " << n;
    ASSERT_EQ(seen, std::vector<uint8_t>(data.begin() + static_cast<long>(in_off), data.begin() + static_cast<long>(in_off + n)));
    EXPECT_LE(max_block, 1u << 20);
  }
}

TEST(CopyFileBytes, ShortSourceIsAnError) {
  std::mt19937_64 rng(6);
  TempFile src("short_src"), dst("short_dst");
  const auto data = random_bytes(10000, rng);
  ASSERT_TRUE(pwrite_full(src.fd, data.data(), data.size(), 0, src.path).ok());
  Status st = copy_file_bytes(src.fd, 5000, dst.fd, 0, 6000, dst.path);
  EXPECT_EQ(st.code(), "ShortSource") << st.to_string();
  EXPECT_NE(st.message().find(dst.path), std::string::npos);
  st = copy_file_bytes(src.fd, 20000, dst.fd, 0, 1, dst.path);
  EXPECT_EQ(st.code(), "ShortSource") << st.to_string();
}

// The source is cut while mapped: either the write of a block whose pages are gone fails
// (EFAULT) or reading them (as hashing does) raises SIGBUS; both must come back as ShortSource.
TEST(CopyFileBytes, SourceShrinkingWhileMappedIsAnErrorNotACrash) {
  std::mt19937_64 rng(7);
  const auto data = random_bytes(6u << 20, rng);
  for (uint64_t cut : {uint64_t{4096}, uint64_t{(1u << 20) + 4096}}) {
    TempFile src("shrink_src"), dst("shrink_dst");
    ASSERT_TRUE(pwrite_full(src.fd, data.data(), data.size(), 0, src.path).ok());
    int calls = 0;
    volatile uint8_t sink = 0;
    Status st = copy_file_bytes(src.fd, 0, dst.fd, 0, data.size(), dst.path, [&](const void* p, size_t k) {
      const auto* b = static_cast<const volatile uint8_t*>(p);
      sink = sink + b[0] + b[k - 1];  // touch the block like a hash would
      if (calls++ == 0) {
        ASSERT_EQ(::ftruncate(src.fd, static_cast<off_t>(cut)), 0);
      }
    });
    EXPECT_EQ(st.code(), "ShortSource") << "cut at " << cut << ": " << st.to_string();
    EXPECT_GE(calls, 1);
  }
}

TEST(CopyFileBytes, UnmappableSourceFallsBackToReads) {
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  const std::string msg = "bytes through a pipe";
  ASSERT_EQ(::write(p[1], msg.data(), msg.size()), static_cast<ssize_t>(msg.size()));
  ::close(p[1]);
  TempFile dst("pipe_dst");
  // A pipe has no offsets: pread fails with ESPIPE, which must come back as an error, not a hang.
  Status st = copy_file_bytes(p[0], 0, dst.fd, 0, msg.size(), dst.path);
  EXPECT_FALSE(st.ok());
  ::close(p[0]);
}

// with_mapped_range: fn sees exactly the bytes of the range (any alignment); a file cut short
// under the mapping is ShortSource (SIGBUS caught), not a crash; a pipe cannot be mapped: an error.
TEST(WithMappedRange, SeesTheRangeAndReportsShrinkingAndUnmappableFiles) {
  std::mt19937_64 rng(9);
  const auto data = random_bytes((3u << 20) + 123, rng);
  TempFile src("mapped_src");
  ASSERT_TRUE(pwrite_full(src.fd, data.data(), data.size(), 0, src.path).ok());
  for (uint64_t off : {uint64_t{0}, uint64_t{1}, uint64_t{4095}, uint64_t{(1u << 20) + 7}}) {
    const uint64_t n = data.size() - off - 5;
    std::vector<uint8_t> seen;
    ASSERT_TRUE(with_mapped_range(src.fd, off, n, src.path, [&](const uint8_t* p) { seen.assign(p, p + n); }).ok());
    EXPECT_TRUE(std::equal(seen.begin(), seen.end(), data.begin() + static_cast<long>(off))) << "offset " << off;
  }
  volatile uint8_t sink = 0;
  Status st = with_mapped_range(src.fd, 0, data.size(), src.path, [&](const uint8_t* p) {
    EXPECT_EQ(::ftruncate(src.fd, 4096), 0);
    sink = sink + p[data.size() - 1];  // beyond the new end: SIGBUS
  });
  EXPECT_EQ(st.code(), "ShortSource") << st.to_string();
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  bool called = false;
  EXPECT_FALSE(with_mapped_range(fds[0], 0, 10, "a pipe", [&](const uint8_t*) { called = true; }).ok());
  EXPECT_FALSE(called);
  ::close(fds[0]);
  ::close(fds[1]);
}

}  // namespace
}  // namespace ckpt
