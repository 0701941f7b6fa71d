// Executor file ranges: chunks that a source holds as raw file ranges go to a sink that accepts
// them without being read; the bytes equal the naive extraction either way.
#include "reshard/executor.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "formats/base/file_io.h"
#include "reshard/memory_io.h"
#include "tests/reshard/executor_world.h"
#include "tests/test_cases.h"

namespace ckpt {
namespace {

using namespace exec_test;

// A MemorySource whose pieces also lie in a file (with gaps between them, so ranges of two pieces
// never merge) and which offers file_extent() for every row-major run of a box piece.
class FileBackedSource : public MemorySource {
 public:
  FileBackedSource(MemoryCheckpoint c, const std::string& path) : MemorySource(std::move(c)), path_(path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    uint64_t off = 4097;
    for (const auto& d : checkpoint().data) {
      at_.push_back(off);
      EXPECT_TRUE(pwrite_full(fd_, d.data(), d.size(), off, path).ok());
      off += d.size() + 333;
    }
  }
  ~FileBackedSource() override {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  std::optional<FileExtent> file_extent(size_t piece, const Box& sub) override {
    const Piece& p = pieces()[piece];
    if (p.region.is_flat()) return std::nullopt;
    auto start = row_major_run_start(p.region.box, sub);
    if (!start) return std::nullopt;
    const uint64_t es = dtype_size(p.dtype);
    return FileExtent{fd_, at_[piece] + static_cast<uint64_t>(*start) * es, static_cast<uint64_t>(sub.numel()) * es};
  }

 private:
  std::string path_;
  int fd_ = -1;
  std::vector<uint64_t> at_;
};

// A MemorySink that takes file extents by reading them back (pread), counting them.
class ExtentSink : public MemorySink {
 public:
  bool accepts_file_extents() const override { return true; }
  Status write_from_file(size_t piece, const FileExtent& e, int64_t count) override {
    ++extent_writes;
    std::vector<uint8_t> buf(e.bytes);
    CKPT_RETURN_IF_ERROR(pread_full(e.fd, buf.data(), e.bytes, e.offset, "extent"));
    return MemorySink::write(piece, buf.data(), count);
  }
  Status write(size_t piece, const void* data, int64_t count) override {
    ++buffer_writes;
    return MemorySink::write(piece, data, count);
  }
  int extent_writes = 0, buffer_writes = 0;
};

// Chunks whose parts are row runs of file-backed pieces go to the sink as file ranges in storage
// order (several per chunk where a chunk spans pieces); the others are read. Either way the bytes
// equal the naive extraction, for any chunk size and thread count.
TEST(Executor, ChunksAsFileRangesMatchNaiveExtraction) {
  std::mt19937 rng(99);
  const std::string path = ::testing::TempDir() + "/exec_extents_" + std::to_string(::getpid());
  int total_extents = 0;
  const int iters = ckpt::testing::property_cases(12, 60, 2);
  for (int iter = 0; iter < iters; ++iter) {
    World w;
    const Shape shape{256, 1024};  // f32: 4 KiB rows
    w.tensors = {{"a", DType::kF32, shape}, {"b", DType::kF32, shape}};
    w.global = {make_global(shape, 4, static_cast<uint32_t>(rng())), make_global(shape, 4, static_cast<uint32_t>(rng()))};
    auto row_cuts = [&](int step) {
      std::vector<int64_t> cuts{0, 256};
      for (int i = 0; i < 3; ++i) cuts.push_back(static_cast<int64_t>(rng() % (256 / step)) * step);
      std::sort(cuts.begin(), cuts.end());
      cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
      return cuts;
    };
    std::vector<Piece> src_pieces, dst_pieces;
    for (const auto& t : w.tensors) {
      if (t.name == "b" && iter % 3 == 0) {  // column halves: no chunk of b is one run of a piece
        src_pieces.push_back({t.name, Region{Box{{0, 0}, {256, 512}}}, DType::kF32});
        src_pieces.push_back({t.name, Region{Box{{0, 512}, {256, 512}}}, DType::kF32});
      } else {
        auto c = row_cuts(16);  // >= 64 KiB runs
        for (size_t i = 0; i + 1 < c.size(); ++i) src_pieces.push_back({t.name, Region{Box{{c[i], 0}, {c[i + 1] - c[i], 1024}}}, DType::kF32});
      }
      auto d = row_cuts(1);
      for (size_t i = 0; i + 1 < d.size(); ++i) dst_pieces.push_back({t.name, Region{Box{{d[i], 0}, {d[i + 1] - d[i], 1024}}}, DType::kF32});
    }
    for (int threads : {1, 2, 3}) {
      FileBackedSource src(make_source(w, src_pieces), path);
      ExtentSink sink;
      ExecOptions o;
      o.threads = threads;
      o.max_chunk_bytes = (64u << 10) + (rng() % 8) * (100u << 10);
      ASSERT_TRUE(execute(src, sink, w.tensors, dst_pieces, {}, o).ok()) << iter;
      ASSERT_TRUE(sink.committed());
      expect_matches(w, sink.checkpoint());
      total_extents += sink.extent_writes;
    }
  }
  EXPECT_GT(total_extents, 0);
}

// Chunks that start and end inside rows (partial first and last row boxes) of one source piece
// are still one file range each: nothing is read or buffered.
TEST(Executor, ChunksCuttingRowsOfOnePieceAreOneFileRangeEach) {
  World w;
  w.tensors = {{"a", DType::kBF16, {64, 2048}}};
  w.global = {make_global({64, 2048}, 2, 8)};
  std::vector<Piece> pieces = {{"a", Region{Box::whole({64, 2048})}, DType::kBF16}};
  FileBackedSource src(make_source(w, pieces), ::testing::TempDir() + "/exec_rows_" + std::to_string(::getpid()));
  ExtentSink sink;
  ExecOptions o;
  o.threads = 2;
  o.max_chunk_bytes = 10000;  // 1.2 rows of 4 KiB: every chunk cuts rows
  o.max_run_chunk_bytes = 10000;
  ASSERT_TRUE(execute(src, sink, w.tensors, pieces, {}, o).ok());
  expect_matches(w, sink.checkpoint());
  EXPECT_EQ(sink.buffer_writes, 0);
  EXPECT_EQ(sink.extent_writes, (64 * 2048 * 2 + 9999) / 10000);
  EXPECT_EQ(src.reads(), 0u);
}

// A chunk taken as file ranges holds no buffer: by default it spans max_run_chunk_bytes (64 MiB),
// whatever max_chunk_bytes says: the whole 256 KiB piece is one hand-off to the sink.
TEST(Executor, ChunksTakenAsFileRangesSpanTheRunChunkSize) {
  World w;
  w.tensors = {{"a", DType::kBF16, {64, 2048}}};
  w.global = {make_global({64, 2048}, 2, 8)};
  std::vector<Piece> pieces = {{"a", Region{Box::whole({64, 2048})}, DType::kBF16}};
  FileBackedSource src(make_source(w, pieces), ::testing::TempDir() + "/exec_runs_" + std::to_string(::getpid()));
  ExtentSink sink;
  ExecOptions o;
  o.threads = 2;
  o.max_chunk_bytes = 10000;
  ASSERT_TRUE(execute(src, sink, w.tensors, pieces, {}, o).ok());
  expect_matches(w, sink.checkpoint());
  EXPECT_EQ(sink.buffer_writes, 0);
  EXPECT_EQ(sink.extent_writes, 1);
  EXPECT_EQ(src.reads(), 0u);
}

// One chunk spanning two row-split source pieces: two file ranges, in order, and no read.
TEST(Executor, ChunkSpanningTwoPiecesIsTwoFileRanges) {
  World w;
  w.tensors = {{"a", DType::kF32, {256, 1024}}};
  w.global = {make_global({256, 1024}, 4, 5)};
  std::vector<Piece> src_pieces = {{"a", Region{Box{{128, 0}, {128, 1024}}}, DType::kF32},  // listed second-half first
                                   {"a", Region{Box{{0, 0}, {128, 1024}}}, DType::kF32}};
  std::vector<Piece> dst = {{"a", Region{Box::whole({256, 1024})}, DType::kF32}};
  for (int threads : {1, 2}) {
    FileBackedSource src(make_source(w, src_pieces), ::testing::TempDir() + "/exec_two_" + std::to_string(::getpid()));
    ExtentSink sink;
    ExecOptions o;
    o.threads = threads;
    o.max_chunk_bytes = 1 << 20;  // the whole tensor in one chunk
    ASSERT_TRUE(execute(src, sink, w.tensors, dst, {}, o).ok());
    expect_matches(w, sink.checkpoint());
    EXPECT_EQ(sink.extent_writes, 2);
    EXPECT_EQ(sink.buffer_writes, 0);
    EXPECT_EQ(src.reads(), 0u);
  }
}

// A sink that gathers: write_from_files reads the runs back (pread) in order, counting calls.
class GatherSink : public ExtentSink {
 public:
  bool gathers_file_runs() const override { return true; }
  Status write_from_files(size_t piece, const std::vector<FileExtent>& runs, int64_t count) override {
    ++gather_writes;
    std::vector<uint8_t> buf;
    for (const FileExtent& e : runs) {
      const size_t at = buf.size();
      buf.resize(at + e.bytes);
      CKPT_RETURN_IF_ERROR(pread_full(e.fd, buf.data() + at, e.bytes, e.offset, "run"));
    }
    return MemorySink::write(piece, buf.data(), count);
  }
  int gather_writes = 0;
};

// Row-parallel shards (each piece a column block, e.g. o_proj / down_proj of tp ranks) into a
// whole tensor: each chunk, whole rows or cut inside rows, is one run per row and block, gathered
// by the sink in one call; nothing is read, and the bytes equal the naive extraction.
TEST(Executor, ColumnBlocksGoToAGatheringSinkAsRowRuns) {
  std::mt19937 rng(17);
  for (int tp : {2, 4}) {
    World w;
    const Shape shape{64, 4096};  // bf16: runs of 4096 / tp elements (>= 2 KiB)
    w.tensors = {{"o", DType::kBF16, shape}};
    w.global = {make_global(shape, 2, static_cast<uint32_t>(rng()))};
    std::vector<Piece> src_pieces;
    for (int k = tp - 1; k >= 0; --k) src_pieces.push_back({"o", Region{Box{{0, k * 4096 / tp}, {64, 4096 / tp}}}, DType::kBF16});
    std::vector<Piece> dst = {{"o", Region{Box::whole(shape)}, DType::kBF16}};
    for (int threads : {1, 2}) {
      FileBackedSource src(make_source(w, src_pieces), ::testing::TempDir() + "/exec_gather_" + std::to_string(::getpid()));
      GatherSink sink;
      ExecOptions o;
      o.threads = threads;
      o.max_chunk_bytes = 40000 + (rng() % 5) * 7777;  // cuts rows
      ASSERT_TRUE(execute(src, sink, w.tensors, dst, {}, o).ok());
      expect_matches(w, sink.checkpoint());
      EXPECT_GT(sink.gather_writes, 0);
      EXPECT_EQ(sink.buffer_writes, 0);
      EXPECT_EQ(src.reads(), 0u);
    }
  }
}

// The same blocks to a sink that does not gather, or with runs under 1 KiB: read and buffered.
TEST(Executor, ColumnBlocksAreReadForNonGatheringSinksAndNarrowRuns) {
  World w;
  w.tensors = {{"o", DType::kBF16, {64, 2048}}, {"n", DType::kBF16, {64, 256}}};
  w.global = {make_global({64, 2048}, 2, 3), make_global({64, 256}, 2, 4)};
  std::vector<Piece> src_pieces = {{"o", Region{Box{{0, 0}, {64, 1024}}}, DType::kBF16},
                                   {"o", Region{Box{{0, 1024}, {64, 1024}}}, DType::kBF16},
                                   {"n", Region{Box{{0, 0}, {64, 128}}}, DType::kBF16},
                                   {"n", Region{Box{{0, 128}, {64, 128}}}, DType::kBF16}};
  std::vector<Piece> dst = {{"o", Region{Box::whole({64, 2048})}, DType::kBF16}, {"n", Region{Box::whole({64, 256})}, DType::kBF16}};
  {
    FileBackedSource src(make_source(w, src_pieces), ::testing::TempDir() + "/exec_nogather_" + std::to_string(::getpid()));
    ExtentSink sink;
    ASSERT_TRUE(execute(src, sink, w.tensors, dst, {}, ExecOptions{}).ok());
    expect_matches(w, sink.checkpoint());
    EXPECT_EQ(sink.extent_writes, 0);
  }
  FileBackedSource src(make_source(w, src_pieces), ::testing::TempDir() + "/exec_narrow_" + std::to_string(::getpid()));
  GatherSink sink;
  ASSERT_TRUE(execute(src, sink, w.tensors, dst, {}, ExecOptions{}).ok());
  expect_matches(w, sink.checkpoint());
  EXPECT_EQ(sink.gather_writes, 1);  // "o": 2 KiB runs
  EXPECT_EQ(sink.buffer_writes, 1);  // "n": 256-byte runs are read
}

}  // namespace
}  // namespace ckpt
