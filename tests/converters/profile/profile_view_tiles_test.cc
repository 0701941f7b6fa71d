// The transposed reads of the profile views (converters/profile/profile_view.h) against a naive
// element-by-element transpose written here: odd shapes, transpose tiles and executor chunks that
// divide neither the rows nor the columns, bf16 / fp16 / fp32, canonical pieces split by rows and
// by columns, both directions (canonical -> stored [in, out] through the profile view, and back
// through the canonical view), and an f32 -> bf16 cast on the way (round to nearest even, written
// out here bit by bit).
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "converters/profile/profile_view.h"
#include "reshard/executor.h"
#include "reshard/memory_io.h"

namespace ckpt {
namespace {

constexpr int64_t kRows = 37, kCols = 53;  // canonical [out, in]

// Random element bits, finite for float types (exponent never all ones).
std::vector<uint8_t> random_elements(DType dt, int64_t n, uint32_t seed) {
  std::mt19937 g(seed);
  const size_t es = dtype_size(dt);
  std::vector<uint8_t> v(static_cast<size_t>(n) * es);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t x = g();
    if (dt == DType::kF32) x &= 0xBFFFFFFFu;              // exponent < 0xFF
    if (dt == DType::kBF16) x &= 0xBFFFu;                 // same, top half
    if (dt == DType::kF16) x &= 0xBBFFu;                  // exponent < 0x1F
    std::memcpy(v.data() + static_cast<size_t>(i) * es, &x, es);
  }
  return v;
}

// f32 bits -> bf16 bits, round to nearest even (finite inputs).
uint16_t naive_bf16(uint32_t f) { return static_cast<uint16_t>((f + 0x7FFFu + ((f >> 16) & 1u)) >> 16); }

// A dense [rows, cols] tensor as pieces: split at `cut` along dim `dim`.
MemoryCheckpoint split_tensor(const std::string& name, DType dt, int64_t rows, int64_t cols,
                              const std::vector<uint8_t>& bytes, int dim, int64_t cut) {
  MemoryCheckpoint m;
  m.tensors = {{name, dt, {rows, cols}}};
  const size_t es = dtype_size(dt);
  const Box whole = Box::whole({rows, cols});
  for (int k = 0; k < 2; ++k) {
    Box b = whole;
    b.offset[dim] = k == 0 ? 0 : cut;
    b.extent[dim] = k == 0 ? cut : (dim == 0 ? rows : cols) - cut;
    std::vector<uint8_t> part(static_cast<size_t>(b.numel()) * es);
    copy_box(bytes.data(), whole, part.data(), b, b, es);
    m.pieces.push_back({name, Region{b}, dt});
    m.data.push_back(std::move(part));
  }
  return m;
}

std::vector<uint8_t> materialize_one(TensorSource& src, uint64_t chunk) {
  const TensorMeta& t = src.tensors().at(0);
  MemorySink sink;
  ExecOptions eo;
  eo.max_chunk_bytes = chunk;
  Status st = execute(src, sink, src.tensors(), {{t.name, Region{Box::whole(t.shape)}, t.dtype}}, src.metadata(), eo);
  EXPECT_TRUE(st.ok()) << st.to_string();
  MemoryCheckpoint out = sink.take();
  return out.data.empty() ? std::vector<uint8_t>{} : out.data[0];
}

struct TileCase {
  DType from, to;
};

class ProfileViewTiles : public ::testing::TestWithParam<TileCase> {};

TEST_P(ProfileViewTiles, SameBytesAsANaiveTransposeBothWays) {
  const DType from = GetParam().from, to = GetParam().to;
  const size_t fs = dtype_size(from), ts = dtype_size(to);
  const std::vector<uint8_t> w = random_elements(from, kRows * kCols, static_cast<uint32_t>(fs * 10 + ts));
  // Expected stored tensor [kCols, kRows]: want[j][i] = cast(w[i][j]).
  std::vector<uint8_t> want(static_cast<size_t>(kRows * kCols) * ts);
  for (int64_t i = 0; i < kRows; ++i)
    for (int64_t j = 0; j < kCols; ++j) {
      const uint8_t* s = w.data() + static_cast<size_t>(i * kCols + j) * fs;
      uint8_t* d = want.data() + static_cast<size_t>(j * kRows + i) * ts;
      if (from == to) {
        std::memcpy(d, s, fs);
      } else {  // f32 -> bf16
        uint32_t f;
        std::memcpy(&f, s, 4);
        const uint16_t h = naive_bf16(f);
        std::memcpy(d, &h, 2);
      }
    }
  ProfileTensor pt{"w_t", {kCols, kRows}, to, true, TensorClass::kWeight, {{"w", Box::whole({kRows, kCols}), 0}}};
  for (int dim : {0, 1})
    for (uint64_t tile : {uint64_t{1}, uint64_t{150}, uint64_t{1000}, uint64_t{1} << 20})
      for (uint64_t chunk : {uint64_t{70}, uint64_t{1} << 20}) {
        SCOPED_TRACE("split dim " + std::to_string(dim) + " tile " + std::to_string(tile) + " chunk " + std::to_string(chunk));
        MemorySource canon(split_tensor("w", from, kRows, kCols, w, dim, dim == 0 ? 11 : 29));
        auto pv = make_profile_view(canon, nullptr, {pt}, {}, {}, tile);
        ASSERT_TRUE(pv.ok()) << pv.status().to_string();
        const std::vector<uint8_t> stored = materialize_one(**pv, chunk);  // staged reads (the pipeline)
        ASSERT_EQ(stored, want);
        for (size_t i = 0; i < (*pv)->pieces().size(); ++i) {  // read() of every piece, tile by tile
          const Box b = (*pv)->pieces()[i].region.box;
          std::vector<uint8_t> got(static_cast<size_t>(b.numel()) * ts), exp(got.size());
          ASSERT_TRUE((*pv)->read(i, b, got.data()).ok());
          copy_box(want.data(), Box::whole({kCols, kRows}), exp.data(), b, b, ts);
          ASSERT_EQ(got, exp) << "piece " << i;
        }
        // Back: the stored [in, out] tensor split the other way, read as canonical [out, in].
        MemorySource st(split_tensor("w_t", to, kCols, kRows, stored, 1 - dim, dim == 0 ? 17 : 8));
        auto cv = make_canonical_view(st, nullptr, {{"w", to, {kRows, kCols}}}, {pt}, {}, tile);
        ASSERT_TRUE(cv.ok()) << cv.status().to_string();
        const std::vector<uint8_t> back = materialize_one(**cv, chunk);
        for (size_t i = 0; i < (*cv)->pieces().size(); ++i) {  // read() of every canonical piece
          const Box b = (*cv)->pieces()[i].region.box;
          std::vector<uint8_t> got(static_cast<size_t>(b.numel()) * ts), exp(got.size());
          ASSERT_TRUE((*cv)->read(i, b, got.data()).ok());
          copy_box(back.data(), Box::whole({kRows, kCols}), exp.data(), b, b, ts);
          ASSERT_EQ(got, exp) << "canonical piece " << i;
        }
        ASSERT_EQ(back.size(), static_cast<size_t>(kRows * kCols) * ts);
        for (int64_t i = 0; i < kRows; ++i)
          for (int64_t j = 0; j < kCols; ++j)
            ASSERT_EQ(std::memcmp(back.data() + static_cast<size_t>(i * kCols + j) * ts,
                                  want.data() + static_cast<size_t>(j * kRows + i) * ts, ts),
                      0)
                << i << "," << j;
      }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ProfileViewTiles,
                         ::testing::Values(TileCase{DType::kBF16, DType::kBF16}, TileCase{DType::kF16, DType::kF16},
                                           TileCase{DType::kF32, DType::kF32}, TileCase{DType::kF32, DType::kBF16}));

}  // namespace
}  // namespace ckpt
