#include "converters/profile/transpose_tile.h"

#include <algorithm>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define CKPT_TRANSPOSE_AVX2 1
#endif

namespace ckpt {

namespace transpose_detail {

namespace {

constexpr int64_t kTransposeBlock = 64;  // elements per side of a cache block (SSE2 kernels)

template <typename T>
void transpose_scalar_typed(const T* src, int64_t sn, int64_t m, int64_t n, T* dst, int64_t ld) {
  constexpr int64_t kB = 32;
  for (int64_t i0 = 0; i0 < m; i0 += kB) {
    const int64_t i1 = std::min(m, i0 + kB);
    for (int64_t j0 = 0; j0 < n; j0 += kB) {
      const int64_t j1 = std::min(n, j0 + kB);
      for (int64_t j = j0; j < j1; ++j)
        for (int64_t i = i0; i < i1; ++i) dst[j * ld + i] = src[i * sn + j];
    }
  }
}

// Source rows `sn` elements apart.
void transpose_scalar_any(const uint8_t* src, int64_t sn, int64_t m, int64_t n, uint8_t* dst, int64_t ld, size_t es) {
  switch (es) {
    case 1: return transpose_scalar_typed(src, sn, m, n, dst, ld);
    case 2: return transpose_scalar_typed(reinterpret_cast<const uint16_t*>(src), sn, m, n, reinterpret_cast<uint16_t*>(dst), ld);
    case 4: return transpose_scalar_typed(reinterpret_cast<const uint32_t*>(src), sn, m, n, reinterpret_cast<uint32_t*>(dst), ld);
    case 8: return transpose_scalar_typed(reinterpret_cast<const uint64_t*>(src), sn, m, n, reinterpret_cast<uint64_t*>(dst), ld);
    default:
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) std::memcpy(dst + (j * ld + i) * es, src + (i * sn + j) * es, es);
  }
}

// The elements [i0, i1) x [j0, j1) one by one (edges of the vector kernels); source rows `sn` apart.
template <typename T>
void transpose_rect(const T* src, int64_t sn, T* dst, int64_t ld, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; ++j)
    for (int64_t i = i0; i < i1; ++i) dst[j * ld + i] = src[i * sn + j];
}

#if defined(__SSE2__)
inline __m128i load_row(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
inline void store_row(void* p, __m128i v) { _mm_storeu_si128(static_cast<__m128i*>(p), v); }

// 8 x 8 two-byte elements: rows s[0..8) (sn apart) -> rows d[0..8) (ld apart).
inline void transpose_8x8_u16(const uint16_t* s, int64_t sn, uint16_t* d, int64_t ld) {
  __m128i r[8], a[8], b[8];
  for (int k = 0; k < 8; ++k) r[k] = load_row(s + k * sn);
  for (int k = 0; k < 4; ++k) {
    a[2 * k] = _mm_unpacklo_epi16(r[2 * k], r[2 * k + 1]);      // columns 0..3 of rows 2k, 2k+1
    a[2 * k + 1] = _mm_unpackhi_epi16(r[2 * k], r[2 * k + 1]);  // columns 4..7
  }
  b[0] = _mm_unpacklo_epi32(a[0], a[2]);  // columns 0, 1 of rows 0..3
  b[1] = _mm_unpackhi_epi32(a[0], a[2]);  // columns 2, 3
  b[2] = _mm_unpacklo_epi32(a[1], a[3]);  // columns 4, 5
  b[3] = _mm_unpackhi_epi32(a[1], a[3]);  // columns 6, 7
  b[4] = _mm_unpacklo_epi32(a[4], a[6]);  // the same of rows 4..7
  b[5] = _mm_unpackhi_epi32(a[4], a[6]);
  b[6] = _mm_unpacklo_epi32(a[5], a[7]);
  b[7] = _mm_unpackhi_epi32(a[5], a[7]);
  for (int k = 0; k < 4; ++k) {
    store_row(d + (2 * k) * ld, _mm_unpacklo_epi64(b[k], b[k + 4]));
    store_row(d + (2 * k + 1) * ld, _mm_unpackhi_epi64(b[k], b[k + 4]));
  }
}

// 4 x 4 four-byte elements.
inline void transpose_4x4_u32(const uint32_t* s, int64_t sn, uint32_t* d, int64_t ld) {
  const __m128i r0 = load_row(s), r1 = load_row(s + sn), r2 = load_row(s + 2 * sn), r3 = load_row(s + 3 * sn);
  const __m128i a0 = _mm_unpacklo_epi32(r0, r1), a1 = _mm_unpackhi_epi32(r0, r1);  // cols 0,1 / 2,3 of rows 0,1
  const __m128i a2 = _mm_unpacklo_epi32(r2, r3), a3 = _mm_unpackhi_epi32(r2, r3);  // of rows 2,3
  store_row(d, _mm_unpacklo_epi64(a0, a2));
  store_row(d + ld, _mm_unpackhi_epi64(a0, a2));
  store_row(d + 2 * ld, _mm_unpacklo_epi64(a1, a3));
  store_row(d + 3 * ld, _mm_unpackhi_epi64(a1, a3));
}

// [m, n] elements with source rows `sn` apart: cache blocks of kTransposeBlock^2 elements, K x K
// register tiles inside, the rest one by one.
template <typename T, int64_t K, void (*Tile)(const T*, int64_t, T*, int64_t)>
void transpose_vector_typed(const T* src, int64_t sn, int64_t m, int64_t n, T* dst, int64_t ld) {
  for (int64_t i0 = 0; i0 < m; i0 += kTransposeBlock) {
    const int64_t i1 = std::min(m, i0 + kTransposeBlock);
    const int64_t iv = i0 + (i1 - i0) / K * K;
    for (int64_t j0 = 0; j0 < n; j0 += kTransposeBlock) {
      const int64_t j1 = std::min(n, j0 + kTransposeBlock);
      const int64_t jv = j0 + (j1 - j0) / K * K;
      for (int64_t i = i0; i < iv; i += K)
        for (int64_t j = j0; j < jv; j += K) Tile(src + i * sn + j, sn, dst + j * ld + i, ld);
      transpose_rect(src, sn, dst, ld, i0, iv, jv, j1);  // right edge of the full rows
      transpose_rect(src, sn, dst, ld, iv, i1, j0, j1);  // bottom edge
    }
  }
}

void transpose_sse2(const uint8_t* src, int64_t sn, int64_t m, int64_t n, uint8_t* dst, int64_t ld, size_t es) {
  if (es == 2)
    transpose_vector_typed<uint16_t, 8, transpose_8x8_u16>(reinterpret_cast<const uint16_t*>(src), sn, m, n,
                                                           reinterpret_cast<uint16_t*>(dst), ld);
  else
    transpose_vector_typed<uint32_t, 4, transpose_4x4_u32>(reinterpret_cast<const uint32_t*>(src), sn, m, n,
                                                           reinterpret_cast<uint32_t*>(dst), ld);
}
#endif

}  // namespace

#if defined(CKPT_TRANSPOSE_AVX2)
// converters/profile/transpose_avx2.cc: 2-byte elements, whole 64-byte lines at a time; does rows
// [0, rows_done) x columns [0, cols_done) and leaves the edges (and other sizes: 0 x 0) to the caller.
void transpose_avx2_blocks(const uint8_t* src, int64_t sn, int64_t m, int64_t n, uint8_t* dst, int64_t ld, size_t es,
                           int64_t* rows_done, int64_t* cols_done);
#endif

bool transpose_avx2_available() {
#if defined(CKPT_TRANSPOSE_AVX2)
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
#else
  return false;
#endif
}

void transpose_tile_scalar(const uint8_t* src, int64_t m, int64_t n, uint8_t* dst, int64_t ld, size_t es) {
  transpose_scalar_any(src, n, m, n, dst, ld, es);
}

void transpose_tile_with(TransposeKernel k, const uint8_t* src, int64_t sn, int64_t m, int64_t n, uint8_t* dst,
                         int64_t ld, size_t es) {
#if defined(__SSE2__)
  if (k != TransposeKernel::kScalar && (es == 2 || es == 4)) {
    int64_t mv = 0, nv = 0;  // the rows x columns the AVX2 blocks did
#if defined(CKPT_TRANSPOSE_AVX2)
    if (k == TransposeKernel::kAvx2 && transpose_avx2_available())
      transpose_avx2_blocks(src, sn, m, n, dst, ld, es, &mv, &nv);
#endif
    // The rest with the SSE2 tiles: the columns right of the blocks (their rows), then the rows below.
    transpose_sse2(src + static_cast<size_t>(nv) * es, sn, mv, n - nv, dst + static_cast<size_t>(nv * ld) * es, ld, es);
    transpose_sse2(src + static_cast<size_t>(mv * sn) * es, sn, m - mv, n, dst + static_cast<size_t>(mv) * es, ld, es);
    return;
  }
#endif
  (void)k;
  transpose_scalar_any(src, sn, m, n, dst, ld, es);
}

}  // namespace transpose_detail

void transpose_tile(const uint8_t* src, int64_t m, int64_t n, uint8_t* dst, int64_t ld, size_t es) {
  transpose_detail::transpose_tile_with(transpose_detail::TransposeKernel::kAvx2, src, n, m, n, dst, ld, es);
}

void transpose_tile_strided(const uint8_t* src, int64_t sn, int64_t m, int64_t n, uint8_t* dst, int64_t ld, size_t es) {
  transpose_detail::transpose_tile_with(transpose_detail::TransposeKernel::kAvx2, src, sn, m, n, dst, ld, es);
}

}  // namespace ckpt
