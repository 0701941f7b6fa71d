// WritePool under OutputFile::copy_runs (formats/io/write_pool.h): the file's bytes equal a naive
// pwrite of the same data whatever the request size, the number of buffers, the threads and files
// sharing the pool, and the reads (windows or a SourceBlocks); the block callback sees each byte
// once, in order; a write that fails behind the copy is returned (by the copy or by close) naming
// the file; the pool never holds more than its buffers; --io auto's probes decide and the bytes
// stay the same; SourceBlocks answers no_room instead of waiting when asked so.
#include "formats/io/write_pool.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "formats/base/file_io.h"
#include "formats/io/output_file.h"
#include "formats/io/source_blocks.h"

namespace ckpt {
namespace {

std::string wp_temp(const std::string& tag) {
  return (std::filesystem::temp_directory_path() / ("ckpt_wp_" + tag + "_" + std::to_string(::getpid()))).string();
}

std::vector<uint8_t> wp_read(const std::string& path) {
  std::vector<uint8_t> v(static_cast<size_t>(std::filesystem::file_size(path)));
  ScopedFd fd = std::move(open_fd(path, O_RDONLY, "open").value());
  EXPECT_TRUE(pread_full(fd.get(), v.data(), v.size(), 0, path).ok());
  return v;
}

// Source files of random bytes, and gathers of runs from them with their expected bytes.
struct Sources {
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<ScopedFd> fds;
  std::vector<std::string> names;
  explicit Sources(int n, size_t size, std::mt19937_64& rng) {
    for (int k = 0; k < n; ++k) {
      bytes.emplace_back(size + 777u * static_cast<unsigned>(k));
      for (auto& b : bytes.back()) b = static_cast<uint8_t>(rng());
      names.push_back(wp_temp("src" + std::to_string(k)));
      fds.push_back(std::move(open_fd(names.back(), O_RDWR | O_CREAT | O_TRUNC, "create").value()));
      EXPECT_TRUE(pwrite_full(fds.back().get(), bytes.back().data(), bytes.back().size(), 0, names.back()).ok());
    }
  }
  ~Sources() {
    for (const auto& n : names) std::filesystem::remove(n);
  }
  // Rows of `row` bytes alternating over the files (tp column blocks), `rows` of them, from `at`.
  std::vector<FileExtent> rows_of(uint64_t row, uint64_t rows, uint64_t at, std::vector<uint8_t>& want) const {
    std::vector<FileExtent> runs;
    for (uint64_t r = 0; r < rows; ++r)
      for (size_t k = 0; k < fds.size(); ++k) {
        const uint64_t off = at + r * row;
        runs.push_back({fds[k].get(), off, row});
        want.insert(want.end(), bytes[k].begin() + static_cast<long>(off), bytes[k].begin() + static_cast<long>(off + row));
      }
    return runs;
  }
};

// Several threads gather into two files sharing one pool of 3 small buffers (a copy at a time per
// range, as the store's copy threads do): each file equals its reference, each callback saw its
// bytes in order, and the pool allocated no more than its buffers.
TEST(WritePool, CopiesOfSeveralThreadsAndFilesMatchNaiveWrites) {
  std::mt19937_64 rng(21);
  Sources src(2, 12u << 20, rng);
  for (uint64_t request : {uint64_t{256} << 10, uint64_t{1} << 20}) {
    for (bool read_ahead : {false, true}) {
      WritePool pool(3, request);
      SourceBlocks blocks(64u << 20, 4);
      std::vector<std::string> paths = {wp_temp("out0"), wp_temp("out1")};
      std::vector<OutputFile> files;
      constexpr int kThreads = 4;
      std::vector<std::vector<uint8_t>> want(kThreads), seen(kThreads);
      std::vector<std::vector<FileExtent>> runs(kThreads);
      std::vector<uint64_t> at(kThreads);
      for (int t = 0; t < kThreads; ++t) {
        const uint64_t row = 1000 + 3000u * static_cast<unsigned>(t);
        runs[t] = src.rows_of(row, (2u << 20) / row, 4096u * static_cast<unsigned>(t), want[t]);
        at[t] = t < 2 ? 0 : want[t - 2].size() + 123;  // two ranges per file, back to back
      }
      for (int k = 0; k < 2; ++k) {
        auto f = OutputFile::open(paths[k], O_WRONLY | O_CREAT | O_TRUNC, IoMode::kDirect, 64u << 20);
        ASSERT_TRUE(f.ok());
        f->set_write_pool(&pool);
        if (read_ahead) f->set_read_ahead(&blocks);
        files.push_back(std::move(*f));
      }
      std::vector<std::thread> threads;
      std::atomic<int> failures{0};
      for (int t = 0; t < kThreads; ++t)
        threads.emplace_back([&, t] {
          Status st = files[static_cast<size_t>(t % 2)].copy_runs(runs[t], at[t], [&, t](const void* p, size_t n) {
            seen[t].insert(seen[t].end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
          });
          if (!st.ok()) ++failures;
        });
      for (auto& th : threads) th.join();
      EXPECT_EQ(failures.load(), 0);
      for (auto& f : files) ASSERT_TRUE(f.close().ok());
      for (int k = 0; k < 2; ++k) {
        std::vector<uint8_t> ref(at[k + 2] + want[k + 2].size());
        std::copy(want[k].begin(), want[k].end(), ref.begin());
        std::copy(want[k + 2].begin(), want[k + 2].end(), ref.begin() + static_cast<long>(at[k + 2]));
        EXPECT_TRUE(wp_read(paths[k]) == ref) << "request " << request << " read_ahead " << read_ahead << " file " << k;
        std::filesystem::remove(paths[k]);
      }
      for (int t = 0; t < kThreads; ++t) EXPECT_TRUE(seen[t] == want[t]) << t;
      const WritePool::Stats st = pool.stats();
      EXPECT_LE(st.allocated, 3u);
      EXPECT_GE(st.writes, 4u);
      EXPECT_EQ(pool.memory(), 3 * pool.request_bytes());
    }
  }
}

// write() from memory through the pool, several threads on distinct ranges of two files, sources
// at every phase modulo 4 KiB (at the file offset's phase: written from the caller's memory; else
// staged in the pool): each file equals a naive pwrite of the same bytes, the caller's memory is
// reused at once (the pool holds its own copy), and the pool was used.
TEST(WritePool, WritesFromMemoryMatchNaiveWrites) {
  std::mt19937_64 rng(34);
  for (uint64_t request : {uint64_t{64} << 10, uint64_t{1} << 20}) {
    WritePool pool(3, request);
    std::vector<std::string> paths = {wp_temp("mem0"), wp_temp("mem1")};
    std::vector<std::vector<uint8_t>> ref(2, std::vector<uint8_t>(6u << 20));
    for (auto& r : ref)
      for (auto& b : r) b = static_cast<uint8_t>(rng());
    std::vector<OutputFile> files;
    for (const auto& path : paths) {
      auto f = OutputFile::open(path, O_WRONLY | O_CREAT | O_TRUNC, IoMode::kDirect, 6u << 20);
      ASSERT_TRUE(f.ok());
      f->set_write_pool(&pool);
      files.push_back(std::move(*f));
    }
    // Pieces of odd sizes cut from each file; thread t writes every kThreads-th piece of both.
    std::vector<std::pair<uint64_t, uint64_t>> pieces;
    for (uint64_t at = 0; at < ref[0].size();) {
      const uint64_t n = std::min<uint64_t>(ref[0].size() - at, 1 + rng() % (700u << 10));
      pieces.push_back({at, n});
      at += n;
    }
    constexpr int kThreads = 3;
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] {
        std::vector<uint8_t> scratch((1u << 20) + 8192);
        for (size_t i = static_cast<size_t>(t); i < pieces.size(); i += kThreads)
          for (int k = 0; k < 2; ++k) {
            const auto [at, n] = pieces[i];
            // the copy sits at phase (at + i) % 4096 of its buffer: sometimes the file offset's
            uint8_t* mem = scratch.data() + (4096 - reinterpret_cast<uintptr_t>(scratch.data()) % 4096) + (at + i % 2) % 4096;
            std::memcpy(mem, ref[k].data() + at, n);
            if (!files[k].write(mem, n, at).ok()) ++failures;
            std::memset(mem, 0xEE, n);  // the caller's memory is free on return
          }
      });
    for (auto& th : threads) th.join();
    EXPECT_EQ(failures.load(), 0);
    for (auto& f : files) ASSERT_TRUE(f.close().ok());
    for (int k = 0; k < 2; ++k) {
      EXPECT_TRUE(wp_read(paths[k]) == ref[k]) << "request " << request << " file " << k;
      std::filesystem::remove(paths[k]);
    }
    EXPECT_GT(pool.stats().writes, 0u);
    EXPECT_LE(pool.stats().allocated, 3u);
  }
}

// Every write fails (/dev/full: ENOSPC): the copy or the close returns the error, naming the file.
TEST(WritePool, AFailedWriteInFlightIsReturnedWithThePath) {
  std::mt19937_64 rng(22);
  Sources src(1, 9u << 20, rng);
  WritePool pool(2, 1u << 20);
  auto f = OutputFile::open("/dev/full", O_WRONLY, IoMode::kDirect, 9u << 20);
  ASSERT_TRUE(f.ok()) << f.status().message();
  f->set_write_pool(&pool);
  Status st = f->copy_runs({{src.fds[0].get(), 0, 8u << 20}}, 0);
  Status closed = f->close();
  Status first = st.ok() ? closed : st;
  ASSERT_FALSE(first.ok());
  EXPECT_NE(first.message().find("/dev/full"), std::string::npos) << first.message();
  EXPECT_FALSE(closed.ok());  // close() waits for the writes in flight and returns their error
}

// --io auto: a direct probe, a buffered probe, then the faster way; the bytes are the same.
TEST(WritePool, AutoProbesBothWaysThenChoosesAndKeepsTheBytes) {
  std::mt19937_64 rng(23);
  Sources src(1, 12u << 20, rng);
  WritePool pool(2, 256u << 10, /*probe_bytes=*/1u << 20);
  pool.set_auto(true);
  const std::string path = wp_temp("auto");
  auto f = OutputFile::open(path, O_WRONLY | O_CREAT | O_TRUNC, IoMode::kAuto, 12u << 20);
  ASSERT_TRUE(f.ok());
  f->set_write_pool(&pool);
  ASSERT_TRUE(f->copy_runs({{src.fds[0].get(), 0, src.bytes[0].size()}}, 0).ok());
  ASSERT_TRUE(f->close().ok());
  EXPECT_TRUE(wp_read(path) == src.bytes[0]);
  const WritePool::Choice c = pool.choice();
  EXPECT_TRUE(c.automatic);
  EXPECT_TRUE(c.decided);
  EXPECT_GT(c.direct_bytes_per_s, 0);
  EXPECT_GT(c.buffered_bytes_per_s, 0);
  EXPECT_EQ(c.route, c.buffered_bytes_per_s > WritePool::kBufferedMargin * c.direct_bytes_per_s ? WritePool::Route::kBuffered
                                                                                                  : WritePool::Route::kDirect);
  std::filesystem::remove(path);
}

// A pool of one buffer: acquire() hands it out once; it is free again after give_back().
TEST(WritePool, HoldsNoMoreThanItsBuffers) {
  WritePool pool(1, 4096);
  char* a = pool.acquire();
  ASSERT_NE(a, nullptr);
  std::atomic<bool> got{false};
  std::thread t([&] {
    char* b = pool.acquire();
    got = true;
    pool.give_back(b);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(got.load());  // waits: the one buffer is held
  pool.give_back(a);
  t.join();
  EXPECT_TRUE(got.load());
  EXPECT_EQ(pool.stats().allocated, 1u);
}

// SourceBlocks::get(..., wait_for_room = false) when every block is held: no_room at once.
TEST(WritePool, SourceBlocksAnswersNoRoomInsteadOfWaiting) {
  std::mt19937_64 rng(24);
  Sources src(1, 64u << 20, rng);
  SourceBlocks blocks(4 * kSourceBlockBytes, 0);
  std::vector<SourceBlocks::Lease> held;
  for (uint64_t i = 0; i < 4; ++i) {
    auto l = blocks.get(src.fds[0].get(), i * kSourceBlockBytes, 1, UINT64_MAX, "t");
    ASSERT_TRUE(l.ok());
    if (!l->p) GTEST_SKIP() << "O_DIRECT refused here";
    held.push_back(*l);
  }
  auto l = blocks.get(src.fds[0].get(), 5 * kSourceBlockBytes, 1, UINT64_MAX, "t", /*wait_for_room=*/false);
  ASSERT_TRUE(l.ok());
  EXPECT_TRUE(l->no_room);
  EXPECT_EQ(l->p, nullptr);
  for (const auto& h : held) blocks.release(h, 0);
  auto again = blocks.get(src.fds[0].get(), 5 * kSourceBlockBytes, 1, UINT64_MAX, "t", /*wait_for_room=*/false);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->no_room);
  EXPECT_EQ(std::memcmp(again->p, src.bytes[0].data() + 5 * kSourceBlockBytes, 4096), 0);
  blocks.release(*again, 0);
}

}  // namespace
}  // namespace ckpt
