// converters/transpose_tile.h: the vector kernels against an element-by-element loop written here,
// for odd shapes (edges of the 8 x 8 / 4 x 4 register tiles and of the 64 x 64 cache blocks),
// every element size, and a destination row longer than the tile (bytes beyond it untouched).
#include "converters/transpose_tile.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace ckpt {
namespace {

std::vector<uint8_t> pattern_bytes(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

TEST(TransposeTile, MatchesElementByElementForOddShapesAndEveryElementSize) {
  const int64_t sizes[] = {1, 3, 7, 8, 9, 15, 16, 17, 63, 64, 65, 71, 130};
  for (size_t es : {size_t{1}, size_t{2}, size_t{4}, size_t{8}, size_t{3}})
    for (int64_t m : sizes)
      for (int64_t n : sizes)
        for (int64_t pad : {int64_t{0}, int64_t{5}}) {
          const int64_t ld = m + pad;
          const std::vector<uint8_t> src = pattern_bytes(static_cast<size_t>(m * n) * es, static_cast<uint32_t>(m * 131 + n));
          std::vector<uint8_t> got(static_cast<size_t>(n * ld) * es, 0xEE), want = got;
          for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j)
              std::memcpy(want.data() + (j * ld + i) * es, src.data() + (i * n + j) * es, es);
          transpose_tile(src.data(), m, n, got.data(), ld, es);
          ASSERT_EQ(got, want) << "es " << es << " m " << m << " n " << n << " ld " << ld;
          std::vector<uint8_t> scalar(got.size(), 0xEE);
          transpose_detail::transpose_tile_scalar(src.data(), m, n, scalar.data(), ld, es);
          ASSERT_EQ(scalar, want) << "scalar: es " << es << " m " << m << " n " << n << " ld " << ld;
        }
}

TEST(TransposeTile, RowsFourKibApart) {
  // 2048 bf16 columns: the shape of the benchmark's q_proj, where the plain loop is slowest.
  const int64_t m = 40, n = 2048;
  const std::vector<uint8_t> src = pattern_bytes(static_cast<size_t>(m * n) * 2, 7);
  std::vector<uint8_t> got(static_cast<size_t>(m * n) * 2), want(got.size());
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) std::memcpy(want.data() + (j * m + i) * 2, src.data() + (i * n + j) * 2, 2);
  transpose_tile(src.data(), m, n, got.data(), m, 2);
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace ckpt
