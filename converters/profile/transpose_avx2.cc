// The AVX2 blocks of transpose_tile (converters/profile/transpose_tile.h) for two-byte elements (bf16,
// fp16: the weights the transposing profiles move), compiled for AVX2 with a function attribute
// and called only when the CPU has it (transpose_avx2_available()). Four-byte elements stay on
// the SSE2 tiles: an AVX2 8 x 8 version of this scheme measured no faster here.
//
// Why line blocks through L1 buffers: the weights' rows are a multiple of 4 KiB apart (2048 bf16
// columns), so the 16 or 32 source rows of a register tile, and the destination rows, all fall
// into one L1 set; kernels that touch each line several times (the SSE2 8 x 8 tiles) miss on
// most of those touches. Here a block of one 64-byte line per row (32 x 32 two-byte or 16 x 16
// four-byte elements) is copied into a dense buffer (each source line read once, whole),
// transposed there in registers (16 x 16 or 8 x 8 tiles) into a second buffer, and written out as
// whole lines (each destination line written once). Blocks go in 8 x 8 groups (a 256 x 256 bf16
// square) so the source and destination lines of a group stay in L2. Measured on the benchmark's
// bf16 shapes ([2048, 2048], [5632, 2048], [2048, 5632]): about 2x the SSE2 tiles
// (docs/BENCHMARKS.md "Profile conversion").
#include "converters/profile/transpose_tile.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include <algorithm>

namespace ckpt::transpose_detail {

namespace {

#define CKPT_AVX2 __attribute__((target("avx2")))

CKPT_AVX2 inline __m256i avx_load(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
CKPT_AVX2 inline void avx_store(void* p, __m256i v) { _mm256_storeu_si256(static_cast<__m256i*>(p), v); }

// 16 x 16 two-byte elements: rows s (sn apart) -> rows d (ld apart). Each 128-bit lane holds 8
// columns; after three unpack rounds lane 0 of a[c] is column c of rows 0..7 and lane 1 column c+8.
CKPT_AVX2 inline void transpose_16x16_u16(const uint16_t* s, int64_t sn, uint16_t* d, int64_t ld) {
  __m256i r[16], a[16];
  for (int k = 0; k < 16; ++k) r[k] = avx_load(s + k * sn);
  for (int k = 0; k < 8; ++k) {
    a[2 * k] = _mm256_unpacklo_epi16(r[2 * k], r[2 * k + 1]);      // cols 0..3 (8..11) of rows 2k, 2k+1
    a[2 * k + 1] = _mm256_unpackhi_epi16(r[2 * k], r[2 * k + 1]);  // cols 4..7 (12..15)
  }
  for (int k = 0; k < 4; ++k) {
    r[4 * k + 0] = _mm256_unpacklo_epi32(a[4 * k + 0], a[4 * k + 2]);  // cols 0, 1 of rows 4k..4k+3
    r[4 * k + 1] = _mm256_unpackhi_epi32(a[4 * k + 0], a[4 * k + 2]);  // cols 2, 3
    r[4 * k + 2] = _mm256_unpacklo_epi32(a[4 * k + 1], a[4 * k + 3]);  // cols 4, 5
    r[4 * k + 3] = _mm256_unpackhi_epi32(a[4 * k + 1], a[4 * k + 3]);  // cols 6, 7
  }
  for (int k = 0; k < 2; ++k)
    for (int c = 0; c < 4; ++c) {
      a[8 * k + 2 * c] = _mm256_unpacklo_epi64(r[8 * k + c], r[8 * k + 4 + c]);      // col 2c of rows 8k..8k+7
      a[8 * k + 2 * c + 1] = _mm256_unpackhi_epi64(r[8 * k + c], r[8 * k + 4 + c]);  // col 2c+1
    }
  for (int c = 0; c < 8; ++c) {
    avx_store(d + c * ld, _mm256_permute2x128_si256(a[c], a[8 + c], 0x20));
    avx_store(d + (c + 8) * ld, _mm256_permute2x128_si256(a[c], a[8 + c], 0x31));
  }
}

// One block of B x B elements (B * sizeof(T) = 64 bytes: one line per row) through two L1
// buffers, K x K register tiles in between.
template <typename T, int K, void (*Tile)(const T*, int64_t, T*, int64_t)>
CKPT_AVX2 inline void transpose_line_block(const T* s, int64_t sn, T* d, int64_t ld) {
  constexpr int B = 64 / static_cast<int>(sizeof(T));
  alignas(64) T a[B * B], b[B * B];
  for (int r = 0; r < B; ++r) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(a + r * B), avx_load(s + r * sn));
    _mm256_store_si256(reinterpret_cast<__m256i*>(a + r * B + B / 2), avx_load(s + r * sn + B / 2));
  }
  for (int i = 0; i < B; i += K)
    for (int j = 0; j < B; j += K) Tile(a + i * B + j, B, b + j * B + i, B);
  for (int r = 0; r < B; ++r) {
    avx_store(d + r * ld, _mm256_load_si256(reinterpret_cast<const __m256i*>(b + r * B)));
    avx_store(d + r * ld + B / 2, _mm256_load_si256(reinterpret_cast<const __m256i*>(b + r * B + B / 2)));
  }
}

template <typename T, int K, void (*Tile)(const T*, int64_t, T*, int64_t)>
CKPT_AVX2 void transpose_line_blocks(const T* src, int64_t sn, int64_t m, int64_t n, T* dst, int64_t ld) {
  constexpr int64_t B = 64 / sizeof(T), kGroup = 8 * B;
  for (int64_t i0 = 0; i0 < m; i0 += kGroup)
    for (int64_t j0 = 0; j0 < n; j0 += kGroup) {
      const int64_t i1 = std::min(m, i0 + kGroup), j1 = std::min(n, j0 + kGroup);
      for (int64_t i = i0; i < i1; i += B)
        for (int64_t j = j0; j < j1; j += B) transpose_line_block<T, K, Tile>(src + i * sn + j, sn, dst + j * ld + i, ld);
    }
}

}  // namespace

void transpose_avx2_blocks(const uint8_t* src, int64_t sn, int64_t m, int64_t n, uint8_t* dst, int64_t ld, size_t es,
                           int64_t* rows_done, int64_t* cols_done) {
  const int64_t B = 64 / static_cast<int64_t>(es);
  const int64_t mv = m / B * B, nv = n / B * B;
  *rows_done = *cols_done = 0;
  if (mv == 0 || nv == 0 || es != 2) return;
  transpose_line_blocks<uint16_t, 16, transpose_16x16_u16>(reinterpret_cast<const uint16_t*>(src), sn, mv, nv,
                                                           reinterpret_cast<uint16_t*>(dst), ld);
  *rows_done = mv;
  *cols_done = nv;
}

}  // namespace ckpt::transpose_detail

#undef CKPT_AVX2
#endif
