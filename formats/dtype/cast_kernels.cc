#include "formats/dtype/cast_kernels.h"

#include <atomic>
#include <cmath>
#include <cstring>

#include "formats/dtype/float_bits.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define CKPT_CAST_X86 1
#else
#define CKPT_CAST_X86 0
#endif

namespace ckpt::cast_detail {

namespace {

// They are written as plain loops the compiler vectorizes, and compiled once for the baseline ISA
// and once for AVX2 (+F16C intrinsics for f16).

#define CKPT_INLINE inline __attribute__((always_inline))

// Per-element bodies: convert one element, return a value whose bit 15 is set when the element
// needs the scalar path. run_chunks() applies one over n elements in fixed chunks of 16, which
// GCC vectorizes at -O2 (its cheap cost model skips loops of unknown trip count).

// bf16 -> f32: exact bit shift; flag = exponent all ones.
CKPT_INLINE uint32_t e_bf16_to_f32(const uint8_t* __restrict src, uint8_t* __restrict dst) {
  uint16_t h;
  std::memcpy(&h, src, 2);
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  std::memcpy(dst, &u, 4);
  return (h & 0x7F80u) + 0x80u;  // bit 15 set iff the exponent field is all ones
}

// f32 -> bf16: round to nearest even by integer add; flag = result exponent all ones (input
// NaN/Inf, or overflow to Inf).
CKPT_INLINE uint32_t e_f32_to_bf16(const uint8_t* __restrict src, uint8_t* __restrict dst) {
  uint32_t u;
  std::memcpy(&u, src, 4);
  const uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const uint16_t h = static_cast<uint16_t>(r);
  std::memcpy(dst, &h, 2);
  return (r & 0x7F80u) + 0x80u;
}

// f16 -> f32, portable: exact (normal values by rebias, subnormals by a float subtract).
CKPT_INLINE uint32_t e_f16_to_f32(const uint8_t* __restrict src, uint8_t* __restrict dst) {
  uint16_t h;
  std::memcpy(&h, src, 2);
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const float normalized = f32_from((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  const float denormalized = f32_from((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t r = sign | (two_w < (1u << 27) ? f32_bits(denormalized) : f32_bits(normalized));
  std::memcpy(dst, &r, 4);
  return (h & 0x7C00u) + 0x400u;  // bit 15 set iff exponent all ones
}

// f32 -> f16, portable: round to nearest even via float arithmetic (scale, add a magic bias,
// read bits). Overflow gives Inf; flag = result exponent all ones.
CKPT_INLINE uint32_t e_f32_to_f16(const uint8_t* __restrict src, uint8_t* __restrict dst) {
  uint32_t w;
  std::memcpy(&w, src, 4);
  const float f = f32_from(w);
  float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  bias = bias < 0x71000000u ? 0x71000000u : bias;
  base = f32_from((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = f32_bits(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  const uint32_t r = (sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign);
  const uint16_t h = static_cast<uint16_t>(r);
  std::memcpy(dst, &h, 2);
  return (r & 0x7C00u) + 0x400u;
}

template <uint32_t (*E)(const uint8_t*, uint8_t*), size_t IS, size_t OS>
CKPT_INLINE uint32_t run_chunks(const uint8_t* __restrict src, uint8_t* __restrict dst, size_t n) {
  uint32_t flag = 0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    uint32_t f = 0;
    for (size_t j = 0; j < 16; ++j) f |= E(src + (i + j) * IS, dst + (i + j) * OS);
    flag |= f;
  }
  for (; i < n; ++i) flag |= E(src + i * IS, dst + i * OS);
  return flag & 0x8000u;
}

CKPT_INLINE uint32_t k_bf16_to_f32(const uint8_t* s, uint8_t* d, size_t n) { return run_chunks<e_bf16_to_f32, 2, 4>(s, d, n); }
CKPT_INLINE uint32_t k_f32_to_bf16(const uint8_t* s, uint8_t* d, size_t n) { return run_chunks<e_f32_to_bf16, 4, 2>(s, d, n); }
CKPT_INLINE uint32_t k_f16_to_f32(const uint8_t* s, uint8_t* d, size_t n) { return run_chunks<e_f16_to_f32, 2, 4>(s, d, n); }
CKPT_INLINE uint32_t k_f32_to_f16(const uint8_t* s, uint8_t* d, size_t n) { return run_chunks<e_f32_to_f16, 4, 2>(s, d, n); }

uint32_t k_bf16_to_f32_base(const uint8_t* s, uint8_t* d, size_t n, bool) { return k_bf16_to_f32(s, d, n); }
uint32_t k_f32_to_bf16_base(const uint8_t* s, uint8_t* d, size_t n, bool) { return k_f32_to_bf16(s, d, n); }
uint32_t k_f16_to_f32_base(const uint8_t* s, uint8_t* d, size_t n, bool) { return k_f16_to_f32(s, d, n); }
uint32_t k_f32_to_f16_base(const uint8_t* s, uint8_t* d, size_t n, bool) { return k_f32_to_f16(s, d, n); }

#if CKPT_CAST_X86
__attribute__((target("avx2"))) inline void st256(uint8_t* p, __m256i v, bool nt) {
  if (nt) _mm256_stream_si256(reinterpret_cast<__m256i*>(p), v);
  else _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
}
__attribute__((target("avx2"))) inline void st128(uint8_t* p, __m128i v, bool nt) {
  if (nt) _mm_stream_si128(reinterpret_cast<__m128i*>(p), v);
  else _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v);
}
inline bool aligned32(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 31) == 0; }

// AVX2 bf16 kernels: the same integer arithmetic as e_bf16_to_f32 / e_f32_to_bf16, 16 at a time.
__attribute__((target("avx2"))) uint32_t k_bf16_to_f32_avx2(const uint8_t* s, uint8_t* d, size_t n, bool nt) {
  nt = nt && aligned32(d);
  size_t i = 0;
  __m256i acc = _mm256_setzero_si256();
  const __m256i emask = _mm256_set1_epi16(0x7F80);
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 2 * i));  // 16 x bf16
    const __m256i lo = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(h)), 16);
    const __m256i hi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1)), 16);
    st256(d + 4 * i, lo, nt);
    st256(d + 4 * i + 32, hi, nt);
    acc = _mm256_or_si256(acc, _mm256_cmpeq_epi16(_mm256_and_si256(h, emask), emask));
  }
  uint32_t flag = _mm256_testz_si256(acc, acc) ? 0u : 0x8000u;
  if (i < n) flag |= k_bf16_to_f32(s + 2 * i, d + 4 * i, n - i);
  return flag;
}
__attribute__((target("avx2"))) uint32_t k_f32_to_bf16_avx2(const uint8_t* s, uint8_t* d, size_t n, bool nt) {
  nt = nt && aligned32(d);
  size_t i = 0;
  __m256i acc = _mm256_setzero_si256();
  const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7FFF);
  const __m256i emask = _mm256_set1_epi16(0x7F80);
  for (; i + 16 <= n; i += 16) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 4 * i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 4 * i + 32));
    const __m256i ra = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(a, bias), _mm256_and_si256(_mm256_srli_epi32(a, 16), one)), 16);
    const __m256i rb = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(b, bias), _mm256_and_si256(_mm256_srli_epi32(b, 16), one)), 16);
    // packus works per 128-bit lane: [a0..3 b0..3 | a4..7 b4..7] -> reorder 64-bit quarters
    const __m256i r = _mm256_permute4x64_epi64(_mm256_packus_epi32(ra, rb), 0xD8);
    st256(d + 2 * i, r, nt);
    acc = _mm256_or_si256(acc, _mm256_cmpeq_epi16(_mm256_and_si256(r, emask), emask));
  }
  uint32_t flag = _mm256_testz_si256(acc, acc) ? 0u : 0x8000u;
  if (i < n) flag |= k_f32_to_bf16(s + 4 * i, d + 2 * i, n - i);
  return flag;
}
// F16C: hardware conversions are exact (widening) and round to nearest even (narrowing),
// subnormals included. NaN/Inf blocks are flagged and redone by the scalar path.
__attribute__((target("avx2,f16c"))) uint32_t k_f16_to_f32_f16c(const uint8_t* s, uint8_t* d, size_t n, bool nt) {
  nt = nt && aligned32(d);
  size_t i = 0;
  __m256i acc = _mm256_setzero_si256();
  const __m256i emask = _mm256_set1_epi32(0x7F800000);
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 2 * i));
    const __m256 f = _mm256_cvtph_ps(h);
    st256(d + 4 * i, _mm256_castps_si256(f), nt);
    // Inf/NaN in f16 -> Inf/NaN in f32: exponent all ones.
    const __m256i e = _mm256_and_si256(_mm256_castps_si256(f), emask);
    acc = _mm256_or_si256(acc, _mm256_cmpeq_epi32(e, emask));
  }
  uint32_t flag = _mm256_testz_si256(acc, acc) ? 0u : 0x8000u;
  if (i < n) flag |= k_f16_to_f32(s + 2 * i, d + 4 * i, n - i);
  return flag;
}
__attribute__((target("avx2,f16c"))) uint32_t k_f32_to_f16_f16c(const uint8_t* s, uint8_t* d, size_t n, bool nt) {
  nt = nt && aligned32(d);
  size_t i = 0;
  __m128i acc = _mm_setzero_si128();
  const __m128i emask = _mm_set1_epi16(0x7C00);
  for (; i + 8 <= n; i += 8) {
    const __m256 f = _mm256_loadu_ps(reinterpret_cast<const float*>(s + 4 * i));
    const __m128i h = _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    st128(d + 2 * i, h, nt);
    const __m128i e = _mm_and_si128(h, emask);
    acc = _mm_or_si128(acc, _mm_cmpeq_epi16(e, emask));
  }
  uint32_t flag = _mm_testz_si128(acc, acc) ? 0u : 0x8000u;
  if (i < n) flag |= k_f32_to_f16(s + 4 * i, d + 2 * i, n - i);
  return flag;
}
#endif

std::atomic<bool> g_portable_only{false};

bool has_avx2_f16c() {
#if CKPT_CAST_X86
  // F16C from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports does not know "f16c".
  static const bool ok = __builtin_cpu_supports("avx2") && [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
  }();
  return ok;
#else
  return false;
#endif
}

}  // namespace

Kernel fast_kernel(DType from, DType to) {
  const bool isa = !g_portable_only.load(std::memory_order_relaxed) && has_avx2_f16c();
  (void)isa;
  if (from == DType::kBF16 && to == DType::kF32) {
#if CKPT_CAST_X86
    if (isa) return k_bf16_to_f32_avx2;
#endif
    return k_bf16_to_f32_base;
  }
  if (from == DType::kF32 && to == DType::kBF16) {
#if CKPT_CAST_X86
    if (isa) return k_f32_to_bf16_avx2;
#endif
    return k_f32_to_bf16_base;
  }
  if (from == DType::kF16 && to == DType::kF32) {
#if CKPT_CAST_X86
    if (isa) return k_f16_to_f32_f16c;
#endif
    return k_f16_to_f32_base;
  }
  if (from == DType::kF32 && to == DType::kF16) {
#if CKPT_CAST_X86
    if (isa) return k_f32_to_f16_f16c;
#endif
    return k_f32_to_f16_base;
  }
  return nullptr;
}

void fence_streaming_stores() {
#if CKPT_CAST_X86
  _mm_sfence();
#endif
}

}  // namespace ckpt::cast_detail

namespace ckpt {

void set_cast_portable_only(bool on) { cast_detail::g_portable_only.store(on, std::memory_order_relaxed); }

}  // namespace ckpt
