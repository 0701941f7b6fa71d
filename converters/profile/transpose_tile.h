// Transposing one dense tile of elements (the `in-out` weights of profile conversions;
// docs/PROFILES.md). A plain element-by-element transpose of a 2-D tile whose rows are a multiple
// of 4 KiB apart (2048 bf16 columns) reads 32 rows that fall into one L1 set and runs at about
// 170 MB/s here. Two- and four-byte elements go through vector registers: two-byte ones on CPUs
// with AVX2 (checked at run time) in blocks of one 64-byte line per row copied through L1 buffers
// (converters/profile/transpose_avx2.cc: each source and destination line touched once, whole); the
// edges, four-byte elements and CPUs without AVX2 in 8 x 8 (2-byte) or 4 x 4 (4-byte) SSE2 tiles
// (x86-64 baseline), 64 x 64 element blocks at a time (docs/BENCHMARKS.md "Profile conversion"). Other
// element sizes and non-x86 builds use the blocked scalar loop. Every kernel gives the same bytes. Pure functions; thread safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ckpt {

// dst[j * ld + i] = src[i * n + j] for i < m, j < n (elements of `es` bytes). `src` is dense
// [m, n]; `dst` has rows of `ld` >= m elements. Buffers must not overlap.
void transpose_tile(const uint8_t* src, int64_t m, int64_t n, uint8_t* dst, int64_t ld, size_t es);
// The same from source rows `sn` >= n elements apart (a column band of wider rows, e.g. read
// straight from a mapping of the stored rows).
void transpose_tile_strided(const uint8_t* src, int64_t sn, int64_t m, int64_t n, uint8_t* dst, int64_t ld, size_t es);

namespace transpose_detail {
// The blocked scalar loop alone (the reference the kernels are tested against).
void transpose_tile_scalar(const uint8_t* src, int64_t m, int64_t n, uint8_t* dst, int64_t ld, size_t es);

// transpose_tile with the kernels up to `k` (kAvx2 on a CPU without AVX2: SSE2), for tests.
enum class TransposeKernel { kScalar, kSse2, kAvx2 };
void transpose_tile_with(TransposeKernel k, const uint8_t* src, int64_t sn, int64_t m, int64_t n, uint8_t* dst,
                         int64_t ld, size_t es);
bool transpose_avx2_available();
}  // namespace transpose_detail

}  // namespace ckpt
