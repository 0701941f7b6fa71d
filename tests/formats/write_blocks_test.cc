// WriteBlocks under OutputFile (formats/io/write_blocks.h): copies and writes inside the declared
// ranges gather into whole requests across calls, threads and pieces; the file equals a naive
// pwrite of the same bytes (gaps between the ranges keep what another writer put there, as HDF5's
// metadata between datasets); each callback sees its bytes in order; a pool too small for the
// blocks left open gives its idle blocks out as they are instead of waiting forever; a byte twice,
// a write across a range's edge and overlapping ranges are errors naming the file.
#include "formats/io/write_blocks.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "formats/base/file_io.h"
#include "formats/io/output_file.h"

namespace ckpt {
namespace {

std::string wb_temp(const std::string& tag) {
  return (std::filesystem::temp_directory_path() / ("ckpt_wb_" + tag + "_" + std::to_string(::getpid()))).string();
}

std::vector<uint8_t> wb_read(const std::string& path) {
  std::vector<uint8_t> v(static_cast<size_t>(std::filesystem::file_size(path)));
  ScopedFd fd = std::move(open_fd(path, O_RDONLY, "open").value());
  EXPECT_TRUE(pread_full(fd.get(), v.data(), v.size(), 0, path).ok());
  return v;
}

// A file laid out as a store shard: pieces of odd sizes with gaps of "metadata" between them (written
// buffered beforehand, as HDF5 does), the source of every piece's bytes in one file.
struct Layout {
  std::vector<ByteRange> pieces;
  std::vector<uint8_t> ref;  // the whole file as it must end
  std::string src_path;
  ScopedFd src;
  Layout(std::mt19937_64& rng, int n, uint64_t max_piece, bool gaps) {
    uint64_t at = 100;
    for (int i = 0; i < n; ++i) {
      const uint64_t len = 1 + rng() % max_piece;
      pieces.push_back({at, at + len});
      at += len + (gaps ? rng() % 3000 : 0);
    }
    fill(rng, at);
  }
  Layout(std::mt19937_64& rng, std::vector<ByteRange> p, uint64_t size) : pieces(std::move(p)) { fill(rng, size); }
  void fill(std::mt19937_64& rng, uint64_t size) {
    ref.resize(size);
    for (auto& b : ref) b = static_cast<uint8_t>(rng());
    src_path = wb_temp("src");
    src = std::move(open_fd(src_path, O_RDWR | O_CREAT | O_TRUNC, "create").value());
    EXPECT_TRUE(pwrite_full(src.get(), ref.data(), ref.size(), 0, src_path).ok());
  }
  ~Layout() { std::filesystem::remove(src_path); }
  // The file with the gaps written (buffered, as another writer would), gathering the pieces.
  Result<OutputFile> open(const std::string& path, WritePool& pool) const {
    CKPT_ASSIGN_OR_RETURN(OutputFile f, OutputFile::open(path, O_WRONLY | O_CREAT | O_TRUNC, IoMode::kDirect, ref.size()));
    uint64_t at = 0;
    for (const ByteRange& p : pieces) {
      CKPT_RETURN_IF_ERROR(pwrite_full(f.fd(), ref.data() + at, p.begin - at, at, path));
      at = p.end;
    }
    CKPT_RETURN_IF_ERROR(pwrite_full(f.fd(), ref.data() + at, ref.size() - at, at, path));
    f.set_write_pool(&pool);
    CKPT_RETURN_IF_ERROR(f.gather_ranges(pieces));
    return f;
  }
  // Piece i cut into chunks of at most `chunk` bytes: {file offset, bytes}.
  std::vector<ByteRange> chunks(size_t i, uint64_t chunk) const {
    std::vector<ByteRange> v;
    for (uint64_t a = pieces[i].begin; a < pieces[i].end; a += chunk) v.push_back({a, std::min(pieces[i].end, a + chunk)});
    return v;
  }
};

// Blocks (of `r` bytes) holding a byte of some piece, and those of them the pieces do not fill whole.
std::pair<uint64_t, uint64_t> touched_and_partial(const std::vector<ByteRange>& pieces, uint64_t r) {
  std::vector<uint64_t> bytes((pieces.back().end + r - 1) / r, 0);
  for (const ByteRange& p : pieces)
    for (uint64_t a = p.begin; a < p.end;) {
      const uint64_t e = std::min(p.end, (a / r + 1) * r);
      bytes[a / r] += e - a;
      a = e;
    }
  uint64_t touched = 0, partial = 0;
  for (uint64_t b : bytes) {
    touched += b > 0;
    partial += b > 0 && b < r;
  }
  return {touched, partial};
}

// One thread copying the pieces in file order, in chunks that end anywhere: every block goes out
// once, whole unless a gap or the file's end is in it; the bytes equal the reference.
TEST(WriteBlocks, CopiesInFileOrderGoOutAsWholeRequests) {
  std::mt19937_64 rng(41);
  Layout lay(rng, 60, 300u << 10, /*gaps=*/true);
  WritePool pool(4, 64u << 10);
  const std::string path = wb_temp("order");
  auto f = lay.open(path, pool);
  ASSERT_TRUE(f.ok()) << f.status().message();
  for (size_t i = 0; i < lay.pieces.size(); ++i)
    for (const ByteRange& c : lay.chunks(i, 1 + rng() % (90u << 10))) {
      std::vector<uint8_t> seen;
      ASSERT_TRUE(f->copy_runs({{lay.src.get(), c.begin, c.end - c.begin}}, c.begin, [&](const void* p, size_t n) {
                      seen.insert(seen.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
                    }).ok());
      ASSERT_TRUE(std::equal(seen.begin(), seen.end(), lay.ref.begin() + static_cast<long>(c.begin), lay.ref.begin() + static_cast<long>(c.end)));
    }
  ASSERT_TRUE(f->close().ok());
  EXPECT_TRUE(wb_read(path) == lay.ref);
  const auto [touched, partial] = touched_and_partial(lay.pieces, pool.request_bytes());
  const WritePool::Stats st = pool.stats();
  EXPECT_EQ(st.writes, touched);
  EXPECT_EQ(st.partial_writes, partial);
  EXPECT_EQ(st.holder_releases, 0u);
  std::filesystem::remove(path);
}

// Four threads, each taking the next piece (as the store's copy threads do), by copies and by
// writes from memory at every phase modulo 4 KiB (written as without the blocks, counted in them:
// the blocks their neighbours' copies share still go out), into a pool of 3 buffers: the bytes
// equal the reference.
TEST(WriteBlocks, ThreadsCopiesAndWritesFromMemoryMatchTheReference) {
  for (bool gaps : {false, true}) {
    std::mt19937_64 rng(gaps ? 42 : 43);
    Layout lay(rng, 80, 200u << 10, gaps);
    WritePool pool(3, 64u << 10);
    const std::string path = wb_temp("threads");
    auto f = lay.open(path, pool);
    ASSERT_TRUE(f.ok()) << f.status().message();
    std::atomic<size_t> next{0};
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        std::vector<uint8_t> scratch((256u << 10) + 8192);
        for (size_t i; (i = next++) < lay.pieces.size();)
          for (const ByteRange& c : lay.chunks(i, (20u << 10) * static_cast<unsigned>(t + 1))) {
            const uint64_t n = c.end - c.begin;
            if (i % 2) {  // from memory, at the file offset's phase for even chunks
              uint8_t* mem = scratch.data() + (4096 - reinterpret_cast<uintptr_t>(scratch.data()) % 4096) + (c.begin + (c.begin / n) % 2) % 4096;
              std::memcpy(mem, lay.ref.data() + c.begin, n);
              if (!f->write(mem, n, c.begin).ok()) ++failures;
              std::memset(mem, 0xEE, n);  // the caller's memory is free on return
            } else if (!f->copy_runs({{lay.src.get(), c.begin, n}}, c.begin).ok()) {
              ++failures;
            }
          }
      });
    for (auto& th : threads) th.join();
    EXPECT_EQ(failures.load(), 0);
    ASSERT_TRUE(f->close().ok());
    EXPECT_TRUE(wb_read(path) == lay.ref) << "gaps " << gaps;
    EXPECT_LE(pool.stats().allocated, 3u);
    std::filesystem::remove(path);
  }
}

// Every block half filled before any is finished, with a pool of 2 buffers: no buffer would come
// back by itself, so the idle blocks go out as they are (holder_releases) and the rest gathers
// again; nothing waits forever and the bytes are right.
TEST(WriteBlocks, APoolTooSmallForTheOpenBlocksReleasesIdleOnes) {
  std::mt19937_64 rng(44);
  Layout lay(rng, {{0, 1u << 20}}, 1u << 20);
  WritePool pool(2, 64u << 10);
  const std::string path = wb_temp("release");
  auto f = lay.open(path, pool);
  ASSERT_TRUE(f.ok()) << f.status().message();
  const uint64_t r = pool.request_bytes();
  for (int half = 0; half < 2; ++half)
    for (uint64_t b = 0; b < (1u << 20) / r; ++b) {
      const uint64_t at = b * r + static_cast<uint64_t>(half) * (r / 2);
      ASSERT_TRUE(f->copy_runs({{lay.src.get(), at, r / 2}}, at).ok());
    }
  ASSERT_TRUE(f->close().ok());
  EXPECT_TRUE(wb_read(path) == lay.ref);
  EXPECT_GT(pool.stats().holder_releases, 0u);
  std::filesystem::remove(path);
}

// The rules: a byte written twice, a write across a declared range's edge, and declared ranges
// that overlap are kInternal errors naming the file.
TEST(WriteBlocks, ErrorsNameTheFile) {
  std::mt19937_64 rng(45);
  Layout lay(rng, 3, 100u << 10, /*gaps=*/true);
  WritePool pool(2, 64u << 10);
  const std::string path = wb_temp("errors");
  auto f = lay.open(path, pool);
  ASSERT_TRUE(f.ok()) << f.status().message();
  const ByteRange p = lay.pieces[0];
  ASSERT_TRUE(f->copy_runs({{lay.src.get(), p.begin, 1000}}, p.begin).ok());
  Status twice = f->copy_runs({{lay.src.get(), p.begin + 500, 1000}}, p.begin + 500);
  EXPECT_EQ(twice.code(), "Internal");
  EXPECT_NE(twice.message().find("written twice"), std::string::npos) << twice.message();
  EXPECT_NE(twice.message().find(path), std::string::npos) << twice.message();
  Status edge = f->write(lay.ref.data(), 100, lay.pieces.back().end - 50);  // past the last range
  EXPECT_EQ(edge.code(), "Internal");
  EXPECT_NE(edge.message().find(path), std::string::npos) << edge.message();
  (void)f->close();
  auto g = OutputFile::open(path, O_WRONLY | O_CREAT | O_TRUNC, IoMode::kDirect, 1u << 20);
  ASSERT_TRUE(g.ok());
  g->set_write_pool(&pool);
  Status overlap = g->gather_ranges({{0, 5000}, {4000, 9000}});
  EXPECT_EQ(overlap.code(), "Internal");
  EXPECT_NE(overlap.message().find(path), std::string::npos) << overlap.message();
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace ckpt
