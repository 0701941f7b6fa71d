// Executor tests: random source/target piece sets (boxes and flat ranges) over random tensors;
// every target piece is compared with a naive element-by-element extraction from the global
// tensor (index arithmetic written out here, independent of copy_box/flat_range_to_boxes).
// Threads: executor_threads_test.cc; file ranges: executor_file_ranges_test.cc.
#include "reshard/executor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "reshard/memory_io.h"
#include "tests/reshard/executor_world.h"
#include "tests/test_cases.h"

namespace ckpt {
namespace {

using namespace exec_test;

TEST(Executor, RandomPieceSetsMatchNaiveExtraction) {
  std::mt19937 rng(1234);
  const int iters = ckpt::testing::property_cases(300, 3000, 24);
  for (int iter = 0; iter < iters; ++iter) {
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
  ASSERT_TRUE(execute_into(src, *idx, sink, dst, o).ok());
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

}  // namespace
}  // namespace ckpt
