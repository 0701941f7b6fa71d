// Executor tests: random source/target piece sets (boxes and flat ranges) over random tensors;
// every target piece is compared with a naive element-by-element extraction from the global
// tensor (index arithmetic written out here, independent of copy_box/flat_range_to_boxes).
#include "reshard/executor.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <set>
#include <thread>

#include "formats/file_io.h"
#include "reshard/memory_io.h"
#include "tests/naive_region.h"

namespace ckpt {
namespace {

// Global tensor data: element g (row-major global flat index) is a unique byte pattern.
std::vector<uint8_t> make_global(const Shape& shape, size_t es, uint32_t seed) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  std::vector<uint8_t> g(static_cast<size_t>(n) * es);
  std::mt19937 rng(seed);
  for (auto& b : g) b = static_cast<uint8_t>(rng());
  return g;
}

using testing_ref::naive_extract;

// Random grid split of a shape into boxes.
std::vector<Box> random_grid(const Shape& shape, std::mt19937& rng, int max_cuts) {
  std::vector<std::vector<int64_t>> cuts(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    cuts[d] = {0, shape[d]};
    int nc = static_cast<int>(rng() % (max_cuts + 1));
    for (int i = 0; i < nc && shape[d] > 1; ++i) cuts[d].push_back(1 + static_cast<int64_t>(rng() % (shape[d] - 1)));
    std::sort(cuts[d].begin(), cuts[d].end());
    cuts[d].erase(std::unique(cuts[d].begin(), cuts[d].end()), cuts[d].end());
  }
  std::vector<Box> boxes{Box{{}, {}}};
  for (size_t d = 0; d < shape.size(); ++d) {
    std::vector<Box> next;
    for (const Box& b : boxes)
      for (size_t i = 0; i + 1 < cuts[d].size(); ++i) {
        Box nb = b;
        nb.offset.push_back(cuts[d][i]);
        nb.extent.push_back(cuts[d][i + 1] - cuts[d][i]);
        next.push_back(nb);
      }
    boxes = next;
  }
  return boxes;
}

// Random piece set covering `t`: grid boxes, some of which are split into flat ranges.
std::vector<Piece> random_pieces(const TensorMeta& t, std::mt19937& rng, DType dt) {
  std::vector<Piece> out;
  for (const Box& b : random_grid(t.shape, rng, 3)) {
    int64_t n = b.numel();
    if (n > 1 && rng() % 2) {
      std::vector<int64_t> cuts{0, n};
      for (int i = 0; i < 3; ++i) cuts.push_back(static_cast<int64_t>(rng() % (n + 1)));
      std::sort(cuts.begin(), cuts.end());
      cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
      for (size_t i = 0; i + 1 < cuts.size(); ++i) out.push_back({t.name, Region{b, cuts[i], cuts[i + 1]}, dt});
    } else {
      out.push_back({t.name, Region{b}, dt});
    }
  }
  return out;
}

struct World {
  std::vector<TensorMeta> tensors;
  std::vector<std::vector<uint8_t>> global;  // per tensor
};

World random_world(std::mt19937& rng, DType dt) {
  World w;
  int nt = 1 + static_cast<int>(rng() % 4);
  for (int i = 0; i < nt; ++i) {
    Shape s;
    int nd = static_cast<int>(rng() % 4);  // rank 0..3
    for (int d = 0; d < nd; ++d) s.push_back(1 + static_cast<int64_t>(rng() % 9));
    w.tensors.push_back({"t" + std::to_string(i), dt, s});
    w.global.push_back(make_global(s, dtype_size(dt), static_cast<uint32_t>(rng())));
  }
  return w;
}

MemoryCheckpoint make_source(const World& w, const std::vector<Piece>& pieces) {
  MemoryCheckpoint c;
  c.tensors = w.tensors;
  c.pieces = pieces;
  for (const Piece& p : pieces) {
    size_t ti = 0;
    while (w.tensors[ti].name != p.tensor) ++ti;
    c.data.push_back(naive_extract(w.global[ti], w.tensors[ti].shape, p.region, dtype_size(p.dtype)));
  }
  return c;
}

void expect_matches(const World& w, const MemoryCheckpoint& out) {
  for (size_t i = 0; i < out.pieces.size(); ++i) {
    const Piece& p = out.pieces[i];
    size_t ti = 0;
    while (w.tensors[ti].name != p.tensor) ++ti;
    auto want = naive_extract(w.global[ti], w.tensors[ti].shape, p.region, dtype_size(p.dtype));
    ASSERT_EQ(out.data[i], want) << "piece " << i << " " << p.tensor << " " << p.region.to_string();
  }
}

TEST(Executor, RandomPieceSetsMatchNaiveExtraction) {
  std::mt19937 rng(1234);
  for (int iter = 0; iter < 300; ++iter) {
    const DType dt = (iter % 3 == 0) ? DType::kBF16 : (iter % 3 == 1 ? DType::kF32 : DType::kF64);
    World w = random_world(rng, dt);
    std::vector<Piece> src_pieces, dst_pieces;
    for (const auto& t : w.tensors) {
      auto a = random_pieces(t, rng, dt), b = random_pieces(t, rng, dt);
      src_pieces.insert(src_pieces.end(), a.begin(), a.end());
      dst_pieces.insert(dst_pieces.end(), b.begin(), b.end());
    }
    // Overlapping duplicate source pieces are allowed (first one wins).
    if (!src_pieces.empty() && iter % 4 == 0) src_pieces.push_back(src_pieces[rng() % src_pieces.size()]);
    std::vector<uint8_t> reference_bytes;
    for (int threads : {1, 2, 3}) {
      MemorySource src(make_source(w, src_pieces));
      MemorySink sink;
      ExecOptions o;
      o.threads = threads;
      o.max_chunk_bytes = 1 + rng() % 64;  // tiny chunks: many boxes per chunk
      uint64_t last_done = 0, last_total = 0;
      o.progress = [&](uint64_t d, uint64_t t) {
        EXPECT_GE(d, last_done);
        last_done = d;
        last_total = t;
      };
      ASSERT_TRUE(execute(src, sink, w.tensors, dst_pieces, {{"k", 1}}, o).ok()) << iter;
      ASSERT_TRUE(sink.committed());
      expect_matches(w, sink.checkpoint());
      EXPECT_EQ(last_done, last_total);
      EXPECT_EQ(sink.checkpoint().metadata["k"], 1);
    }
  }
}

TEST(Executor, ReadGlobalBoxRandomBoxes) {
  std::mt19937 rng(99);
  for (int iter = 0; iter < 200; ++iter) {
    World w = random_world(rng, DType::kF32);
    std::vector<Piece> src_pieces;
    for (const auto& t : w.tensors) {
      auto a = random_pieces(t, rng, DType::kF32);
      src_pieces.insert(src_pieces.end(), a.begin(), a.end());
    }
    MemorySource src(make_source(w, src_pieces));
    auto idx = SourceIndex::build(src);
    ASSERT_TRUE(idx.ok()) << idx.status().to_string();
    for (size_t ti = 0; ti < w.tensors.size(); ++ti) {
      const Shape& s = w.tensors[ti].shape;
      Box b{Shape(s.size()), Shape(s.size())};
      for (size_t d = 0; d < s.size(); ++d) {
        b.offset[d] = static_cast<int64_t>(rng() % s[d]);
        b.extent[d] = 1 + static_cast<int64_t>(rng() % (s[d] - b.offset[d]));
      }
      std::vector<uint8_t> got(static_cast<size_t>(b.numel()) * 4);
      ASSERT_TRUE(read_global_box(src, *idx, w.tensors[ti].name, b, DType::kF32, got.data()).ok());
      EXPECT_EQ(got, naive_extract(w.global[ti], s, Region{b}, 4)) << b.to_string();
    }
  }
}

TEST(Executor, MissingCoverageRefusedBeforeBegin) {
  World w;
  w.tensors = {{"w", DType::kF32, {6, 4}}};
  w.global = {make_global({6, 4}, 4, 7)};
  std::vector<Piece> src_pieces = {{"w", Region{Box{{0, 0}, {3, 4}}}, DType::kF32},
                                   {"w", Region{Box{{3, 0}, {3, 4}}, 0, 10}, DType::kF32}};  // 2 elements missing
  MemorySource src(make_source(w, src_pieces));
  MemorySink sink;
  std::vector<Piece> dst_pieces = {{"w", Region{Box::whole({6, 4})}, DType::kF32}};
  Status st = execute(src, sink, w.tensors, dst_pieces, {}, {});
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), "RegionNotCovered");
  EXPECT_EQ(st.tensor(), "w");
  EXPECT_NE(st.message().find("[5:6, 2:4]"), std::string::npos) << st.to_string();
  EXPECT_NE(st.message().find("2 of 24 elements missing"), std::string::npos) << st.to_string();
  EXPECT_FALSE(sink.began());

  // A target tensor absent from the source.
  std::vector<TensorMeta> tensors = {{"other", DType::kF32, {2}}};
  Status st2 = execute(src, sink, tensors, {{"other", Region{Box::whole({2})}, DType::kF32}}, {}, {});
  EXPECT_EQ(st2.code(), "TensorNotFound");
  EXPECT_FALSE(sink.began());
}

TEST(Executor, CorruptSourcePieceAbortsNamingIt) {
  World w;
  w.tensors = {{"w", DType::kF32, {4, 4}}};
  w.global = {make_global({4, 4}, 4, 8)};
  std::vector<Piece> src_pieces = {{"w", Region{Box{{0, 0}, {2, 4}}}, DType::kF32},
                                   {"w", Region{Box{{2, 0}, {2, 4}}}, DType::kF32}};
  MemoryCheckpoint c = make_source(w, src_pieces);
  c.data[1].pop_back();  // truncated piece
  MemorySource src(std::move(c), "ckpt-A");
  MemorySink sink;
  for (int threads : {1, 2}) {
    MemorySink sk;
    ExecOptions o;
    o.threads = threads;
    o.max_chunk_bytes = 8;
    Status st = execute(src, sk, w.tensors, {{"w", Region{Box::whole({4, 4})}, DType::kF32}}, {}, o);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), "PieceSize");
    EXPECT_NE(st.message().find("piece 1"), std::string::npos) << st.to_string();
    EXPECT_NE(st.message().find("ckpt-A"), std::string::npos) << st.to_string();
    EXPECT_TRUE(sk.aborted());
    EXPECT_FALSE(sk.committed());
  }
}

TEST(Executor, BadSourceListingRejected) {
  std::vector<TensorMeta> t = {{"w", DType::kF32, {4, 4}}};
  EXPECT_EQ(SourceIndex::build(t, {{"w", Region{Box{{3, 0}, {2, 4}}}, DType::kF32}}).status().code(),
            "RegionOutOfBounds");
  EXPECT_EQ(SourceIndex::build(t, {{"x", Region{Box{{0, 0}, {2, 4}}}, DType::kF32}}).status().code(), "UnknownTensor");
  EXPECT_EQ(SourceIndex::build(t, {{"w", Region{Box{{0, 0}, {2, 4}}, 3, 9}, DType::kF32}}).status().code(),
            "FlatRangeOutOfBounds");
  EXPECT_EQ(SourceIndex::build(t, {{"w", Region{Box{{0}, {4}}}, DType::kF32}}).status().code(), "RegionRank");
  std::vector<TensorMeta> dup = {{"w", DType::kF32, {1}}, {"w", DType::kF32, {1}}};
  EXPECT_EQ(SourceIndex::build(dup, {}).status().code(), "DuplicateTensor");
  std::vector<TensorMeta> huge = {{"w", DType::kF32, {1ll << 40, 1ll << 40}}};
  EXPECT_FALSE(SourceIndex::build(huge, {}).ok());
}

TEST(Executor, OnlyPiecesWritesTheSelection) {
  World w;
  w.tensors = {{"w", DType::kF32, {4, 6}}};
  w.global = {make_global({4, 6}, 4, 9)};
  MemorySource src(make_source(w, {{"w", Region{Box::whole({4, 6})}, DType::kF32}}));
  std::vector<Piece> dst = {{"w", Region{Box{{0, 0}, {4, 3}}}, DType::kF32},
                            {"w", Region{Box{{0, 3}, {4, 3}}}, DType::kF32}};
  MemorySink sink;
  ASSERT_TRUE(sink.begin(w.tensors, dst, {}).ok());
  auto idx = SourceIndex::build(src);
  ExecOptions o;
  o.only_pieces = {1};
  ASSERT_TRUE(execute_into(src, *idx, sink, w.tensors, dst, o).ok());
  EXPECT_TRUE(sink.checkpoint().data[0].empty());
  EXPECT_EQ(sink.checkpoint().data[1], naive_extract(w.global[0], {4, 6}, dst[1].region, 4));
}

// Reference f32 -> bf16, round to nearest even (NaN not used here).
uint16_t ref_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t lsb = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7fffu + lsb) >> 16);
}

TEST(Executor, CastsF32ToBF16) {
  std::vector<TensorMeta> t = {{"w", DType::kF32, {5, 7}}};
  std::vector<float> g(35);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 0.02f);
  for (auto& x : g) x = nd(rng);
  MemoryCheckpoint c;
  c.tensors = t;
  c.pieces = {{"w", Region{Box{{0, 0}, {5, 3}}}, DType::kF32}, {"w", Region{Box{{0, 3}, {5, 4}}}, DType::kF32}};
  for (const Piece& p : c.pieces) {
    std::vector<uint8_t> bytes;
    for (int64_t i = 0; i < 5; ++i)
      for (int64_t j = p.region.box.offset[1]; j < p.region.box.offset[1] + p.region.box.extent[1]; ++j) {
        const uint8_t* b = reinterpret_cast<const uint8_t*>(&g[i * 7 + j]);
        bytes.insert(bytes.end(), b, b + 4);
      }
    c.data.push_back(bytes);
  }
  MemorySource src(std::move(c));
  for (int threads : {1, 2}) {
    MemorySink sink;
    ExecOptions o;
    o.threads = threads;
    o.max_chunk_bytes = 6;
    std::vector<TensorMeta> out_t = {{"w", DType::kBF16, {5, 7}}};
    std::vector<Piece> out_p = {{"w", Region{Box{{0, 0}, {5, 7}}, 4, 33}, DType::kBF16}};
    Status st = execute(src, sink, out_t, out_p, {}, o);
    ASSERT_TRUE(st.ok()) << st.to_string();
    const auto& d = sink.checkpoint().data[0];
    ASSERT_EQ(d.size(), 29u * 2);
    for (int k = 4; k < 33; ++k) {
      uint16_t got;
      std::memcpy(&got, d.data() + (k - 4) * 2, 2);
      EXPECT_EQ(got, ref_bf16(g[k])) << k;
    }
  }
}


// A sink that records which thread writes and fails the `fail_at`-th write (0-based; -1 never).
class RecordingSink : public TensorSink {
 public:
  explicit RecordingSink(int fail_at = -1) : fail_at_(fail_at) {}
  Status begin(const std::vector<TensorMeta>& t, const std::vector<Piece>& p, const nlohmann::json& m) override {
    return inner.begin(t, p, m);
  }
  Status write(size_t piece, const void* data, int64_t count) override {
    writer_threads.insert(std::this_thread::get_id());
    if (writes++ == fail_at_) return Status::Io("disk full (injected)");
    return inner.write(piece, data, count);
  }
  Status commit() override { return inner.commit(); }
  void abort() override { inner.abort(); }
  MemorySink inner;
  std::set<std::thread::id> writer_threads;
  int writes = 0;

 private:
  int fail_at_;
};

class RecordingSource : public MemorySource {
 public:
  using MemorySource::MemorySource;
  Status read(size_t piece, const Box& sub, void* dst) override {
    reader_threads.insert(std::this_thread::get_id());
    return MemorySource::read(piece, sub, dst);
  }
  std::set<std::thread::id> reader_threads;
};

TEST(Executor, ReadsOnCallerWritesInOrderOnOneWriterThread) {
  World w;
  w.tensors = {{"w", DType::kF32, {16, 8}}};
  w.global = {make_global({16, 8}, 4, 21)};
  std::vector<Piece> src_pieces = {{"w", Region{Box{{0, 0}, {16, 3}}}, DType::kF32},
                                   {"w", Region{Box{{0, 3}, {16, 5}}}, DType::kF32}};
  std::vector<Piece> dst = {{"w", Region{Box{{0, 0}, {9, 8}}}, DType::kF32}, {"w", Region{Box{{9, 0}, {7, 8}}}, DType::kF32}};
  for (int threads : {1, 2, 3}) {
    RecordingSource src(make_source(w, src_pieces));
    RecordingSink sink;
    ExecOptions o;
    o.threads = threads;
    o.max_chunk_bytes = 40;  // many chunks in flight
    std::vector<uint64_t> progress;
    o.progress = [&](uint64_t done, uint64_t) {
      EXPECT_EQ(src.reader_threads.count(std::this_thread::get_id()), 1u);  // the caller's thread
      progress.push_back(done);
    };
    ASSERT_TRUE(execute(src, sink, w.tensors, dst, {}, o).ok());
    EXPECT_EQ(src.reader_threads, std::set<std::thread::id>{std::this_thread::get_id()}) << threads;
    ASSERT_EQ(sink.writer_threads.size(), 1u) << threads;
    EXPECT_EQ(*sink.writer_threads.begin() == std::this_thread::get_id(), threads == 1) << threads;
    EXPECT_TRUE(std::is_sorted(progress.begin(), progress.end()));
    ASSERT_FALSE(progress.empty());
    EXPECT_EQ(progress.back(), 16u * 8 * 4);
    for (size_t i = 0; i < dst.size(); ++i)
      EXPECT_EQ(sink.inner.checkpoint().data[i], naive_extract(w.global[0], {16, 8}, dst[i].region, 4)) << threads;
  }
}

TEST(Executor, WriteErrorStopsLaterWritesAndAborts) {
  World w;
  w.tensors = {{"w", DType::kF32, {16, 8}}};
  w.global = {make_global({16, 8}, 4, 22)};
  MemorySource src(make_source(w, {{"w", Region{Box::whole({16, 8})}, DType::kF32}}));
  std::vector<Piece> dst = {{"w", Region{Box::whole({16, 8})}, DType::kF32}};
  for (int threads : {1, 2, 3}) {
    RecordingSink sink(/*fail_at=*/3);
    ExecOptions o;
    o.threads = threads;
    o.max_chunk_bytes = 32;  // 16 chunks
    Status st = execute(src, sink, w.tensors, dst, {}, o);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.kind(), ErrorKind::kIo) << st.to_string();
    EXPECT_NE(st.to_string().find("injected"), std::string::npos) << st.to_string();
    EXPECT_NE(st.to_string().find("writing target piece 0"), std::string::npos) << st.to_string();
    EXPECT_EQ(sink.writes, 4) << "no write after the failed one, threads " << threads;
    EXPECT_TRUE(sink.inner.aborted());
    EXPECT_FALSE(sink.inner.committed());
  }
}

TEST(Executor, CastErrorInWorkerStopsWritesAndAborts) {
  std::vector<TensorMeta> t = {{"w", DType::kF32, {64}}};
  std::vector<float> g(64, 1.0f);
  g[40] = 1e30f;  // overflows fp16
  MemoryCheckpoint c;
  c.tensors = t;
  c.pieces = {{"w", Region{Box::whole({64})}, DType::kF32}};
  c.data.emplace_back(reinterpret_cast<const uint8_t*>(g.data()), reinterpret_cast<const uint8_t*>(g.data()) + 256);
  MemorySource src(std::move(c));
  for (int threads : {1, 2, 3}) {
    RecordingSink sink;
    ExecOptions o;
    o.threads = threads;
    o.max_chunk_bytes = 16;  // 8 halves per chunk: chunk 5 holds element 40
    Status st = execute(src, sink, {{"w", DType::kF16, {64}}}, {{"w", Region{Box::whole({64})}, DType::kF16}}, {}, o);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.kind(), ErrorKind::kOverflow) << st.to_string();
    EXPECT_LE(sink.writes, 5) << "nothing written after the failed chunk, threads " << threads;
    EXPECT_TRUE(sink.inner.aborted());
  }
}

}  // namespace
}  // namespace ckpt

namespace ckpt {
namespace {

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
  for (int iter = 0; iter < 12; ++iter) {
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
  ASSERT_TRUE(execute(src, sink, w.tensors, pieces, {}, o).ok());
  expect_matches(w, sink.checkpoint());
  EXPECT_EQ(sink.buffer_writes, 0);
  EXPECT_EQ(sink.extent_writes, (64 * 2048 * 2 + 9999) / 10000);
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

}  // namespace
}  // namespace ckpt
