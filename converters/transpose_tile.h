// Transposing one dense tile of elements (the `in-out` weights of profile conversions, issue 14;
// docs/PROFILES.md). A plain element-by-element transpose of a 2-D tile whose rows are a multiple
// of 4 KiB apart (2048 bf16 columns) reads 32 rows that fall into one L1 set and runs at about
// 170 MB/s here; the kernels below move 8 x 8 (2-byte) or 4 x 4 (4-byte) blocks through SSE2
// registers (x86-64 baseline), 64 x 64 element blocks at a time, about 4x faster (docs/BENCHMARKS.md,
// issue 14). Other element sizes, the edges, and non-x86 builds use the blocked scalar loop.
// Pure functions; thread safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ckpt {

// dst[j * ld + i] = src[i * n + j] for i < m, j < n (elements of `es` bytes). `src` is dense
// [m, n]; `dst` has rows of `ld` >= m elements. Buffers must not overlap.
void transpose_tile(const uint8_t* src, int64_t m, int64_t n, uint8_t* dst, int64_t ld, size_t es);

namespace transpose_detail {
// The blocked scalar loop alone (the reference the kernels are tested against).
void transpose_tile_scalar(const uint8_t* src, int64_t m, int64_t n, uint8_t* dst, int64_t ld, size_t es);
}  // namespace transpose_detail

}  // namespace ckpt
