// converters/profile/transpose_tile.h: every kernel (the AVX2 line blocks where the CPU has AVX2, the SSE2
// tiles, the blocked scalar loop) against an element-by-element loop written here, for odd shapes
// (edges of the 32 x 32 line blocks, their 256 x 256 groups, the 8 x 8 / 4 x 4 register tiles and
// the 64 x 64 cache blocks), every element size, and a destination row longer than the tile
// (bytes beyond it untouched).
#include "converters/profile/transpose_tile.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <algorithm>
#include <cstring>
#include <vector>

namespace ckpt {
namespace {

using transpose_detail::TransposeKernel;

std::vector<uint8_t> pattern_bytes(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

// The naive transpose, padded destination rows (0xEE beyond each row's m elements).
std::vector<uint8_t> naive_transpose(const std::vector<uint8_t>& src, int64_t m, int64_t n, int64_t ld, size_t es) {
  std::vector<uint8_t> want(static_cast<size_t>(n * ld) * es, 0xEE);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) std::memcpy(want.data() + (j * ld + i) * es, src.data() + (i * n + j) * es, es);
  return want;
}

// Every kernel, dense and as a column band (columns [2, 2 + n) of rows n + 5 wide).
void expect_every_kernel(int64_t m, int64_t n, int64_t ld, size_t es) {
  const std::vector<uint8_t> src = pattern_bytes(static_cast<size_t>(m * n) * es, static_cast<uint32_t>(m * 131 + n));
  const std::vector<uint8_t> want = naive_transpose(src, m, n, ld, es);
  std::vector<uint8_t> got(want.size(), 0xEE);
  transpose_tile(src.data(), m, n, got.data(), ld, es);
  ASSERT_EQ(got, want) << "es " << es << " m " << m << " n " << n << " ld " << ld;
  const int64_t sn = n + 5;
  std::vector<uint8_t> wide = pattern_bytes(static_cast<size_t>(m * sn) * es, 3);
  for (int64_t i = 0; i < m; ++i) std::memcpy(wide.data() + (i * sn + 2) * es, src.data() + i * n * es, static_cast<size_t>(n) * es);
  std::vector<uint8_t> band(want.size(), 0xEE);
  transpose_tile_strided(wide.data() + 2 * es, sn, m, n, band.data(), ld, es);
  ASSERT_EQ(band, want) << "strided: es " << es << " m " << m << " n " << n << " ld " << ld;
  for (TransposeKernel k : {TransposeKernel::kScalar, TransposeKernel::kSse2, TransposeKernel::kAvx2}) {
    std::vector<uint8_t> out(want.size(), 0xEE);
    transpose_detail::transpose_tile_with(k, src.data(), n, m, n, out.data(), ld, es);
    ASSERT_EQ(out, want) << "kernel " << static_cast<int>(k) << ": es " << es << " m " << m << " n " << n << " ld " << ld;
    std::fill(out.begin(), out.end(), 0xEE);
    transpose_detail::transpose_tile_with(k, wide.data() + 2 * es, sn, m, n, out.data(), ld, es);
    ASSERT_EQ(out, want) << "kernel " << static_cast<int>(k) << " strided: es " << es << " m " << m << " n " << n;
  }
}

TEST(TransposeTile, MatchesElementByElementForOddShapesAndEveryElementSize) {
  const int64_t sizes[] = {1, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 71, 130};
  for (size_t es : {size_t{1}, size_t{2}, size_t{4}, size_t{8}, size_t{3}})
    for (int64_t m : sizes)
      for (int64_t n : sizes)
        for (int64_t pad : {int64_t{0}, int64_t{5}}) expect_every_kernel(m, n, m + pad, es);
}

TEST(TransposeTile, LineBlockGroupsAndTheirEdges) {
  // Around the AVX2 path's 256 x 256 groups of 32 x 32 blocks (two-byte elements), and four-byte
  // elements of the same shapes.
  const int64_t sizes[] = {255, 256, 257, 288, 300};
  for (size_t es : {size_t{2}, size_t{4}})
    for (int64_t m : sizes)
      for (int64_t n : sizes) expect_every_kernel(m, n, m + (m % 2), es);
}

TEST(TransposeTile, RowsFourKibApart) {
  // 2048 bf16 columns: the shape of the benchmark's q_proj, where the plain loop is slowest.
  expect_every_kernel(40, 2048, 40, 2);
  expect_every_kernel(96, 2048, 100, 2);
}

}  // namespace
}  // namespace ckpt
