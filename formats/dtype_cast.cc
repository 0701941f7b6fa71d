// Numeric casts between ckpt dtypes (declared in formats/dtype.h).
//
// Structure: cast_elements() walks the input in blocks of kBlock elements. Hot pairs
// (bf16/f16 <-> f32) first run a branch-free, vectorizable kernel over the block that also ORs a
// "special" flag (a result or input with an all-ones exponent: Inf, NaN, or overflow). Blocks
// whose flag is clear are done; flagged blocks, and every other pair, go through the exact
// scalar path (cast_block), which applies the policy and counts. Float -> float casts in the
// scalar path decode the source exactly into a double (every value of every float dtype is a
// double) and round once into the target, so there is no double rounding.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "formats/checked.h"
#include "formats/dtype.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define CKPT_CAST_X86 1
#else
#define CKPT_CAST_X86 0
#endif

namespace ckpt {

namespace {

// ---------------------------------------------------------------------------------------------
// Bit helpers.

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float f32_from(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint64_t f64_bits(double d) { uint64_t u; std::memcpy(&u, &d, 8); return u; }
inline double f64_from(uint64_t u) { double d; std::memcpy(&d, &u, 8); return d; }

// A narrow binary float format: `eb` exponent bits, `mb` explicit mantissa bits. IEEE-like
// formats have Inf (exponent all ones, mantissa 0) and NaN (exponent all ones, mantissa != 0).
// `fn` formats (float8_e4m3fn) have no Inf; only S.1111.111 is NaN.
struct NarrowFmt {
  int eb, mb;
  bool fn;
  int bias() const { return (1 << (eb - 1)) - 1; }
  uint32_t exp_mask() const { return ((1u << eb) - 1) << mb; }
  uint32_t sign_bit() const { return 1u << (eb + mb); }
  uint32_t max_finite() const {
    return fn ? ((((1u << eb) - 1) << mb) | ((1u << mb) - 2)) : ((((1u << eb) - 2) << mb) | ((1u << mb) - 1));
  }
  uint32_t inf_bits() const { return exp_mask(); }  // IEEE-like only
  uint32_t quiet_nan() const { return fn ? (exp_mask() | ((1u << mb) - 1)) : (exp_mask() | (1u << (mb - 1))); }
};
constexpr NarrowFmt kFmtF16{5, 10, false};
constexpr NarrowFmt kFmtBF16{8, 7, false};
constexpr NarrowFmt kFmtE4M3{4, 3, true};
constexpr NarrowFmt kFmtE5M2{5, 2, false};

enum class Enc : uint8_t { kOk, kOverflow };

// Rounds a non-NaN double once, to nearest even, into `f`. Returns the bits (without saturation:
// overflow gives the Inf pattern for IEEE-like formats, or the NaN pattern for fn formats) and
// whether a finite input overflowed (or Inf met an fn format).
inline uint32_t encode_narrow(double d, const NarrowFmt& f, Enc* enc) {
  const uint64_t b = f64_bits(d);
  const uint32_t sign = (b >> 63) ? f.sign_bit() : 0;
  const int E = static_cast<int>((b >> 52) & 0x7FF);
  const uint64_t mant = b & ((uint64_t{1} << 52) - 1);
  *enc = Enc::kOk;
  if (E == 0x7FF) {  // Inf (NaN is handled by the caller)
    if (f.fn) { *enc = Enc::kOverflow; return sign | f.quiet_nan(); }
    return sign | f.inf_bits();
  }
  if (E == 0) return sign;  // zero or f64 subnormal: far below half the smallest target subnormal
  const int e = E - 1023;                 // unbiased exponent
  const uint64_t sig = (uint64_t{1} << 52) | mant;  // 53-bit significand, value = sig * 2^(e-52)
  const int emin = 1 - f.bias();
  const int emax = ((1 << f.eb) - 1) - f.bias();  // exponent field all ones, as unbiased
  if (e > emax) {  // beyond every finite value of the target even before rounding
    *enc = Enc::kOverflow;
    return sign | (f.fn ? f.quiet_nan() : f.inf_bits());
  }
  int shift = 52 - f.mb;
  if (e < emin) shift += emin - e;
  uint64_t q;
  if (shift >= 64) {
    q = 0;  // value < 2^-1 * smallest subnormal: rounds to zero
  } else {
    q = sig >> shift;
    const uint64_t rem = sig & ((uint64_t{1} << shift) - 1);
    const uint64_t half = uint64_t{1} << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) ++q;
  }
  uint64_t mag;  // encoded magnitude (exponent field and mantissa)
  if (e < emin) {
    mag = q;  // subnormal (q == 2^mb is the smallest normal, which encodes the same way)
  } else {
    // q in [2^mb, 2^(mb+1)]; the hidden bit carries into the exponent field.
    mag = (static_cast<uint64_t>(e + f.bias() - 1) << f.mb) + q;
  }
  if (mag > f.max_finite()) {
    *enc = Enc::kOverflow;
    return sign | (f.fn ? f.quiet_nan() : f.inf_bits());
  }
  return sign | static_cast<uint32_t>(mag);
}

// NaN of a double into a narrow format: sign and the leading payload bits are kept (the quiet bit
// is the leading payload bit, so a signaling NaN stays signaling); if no kept payload bit is set,
// the lowest one is set so the result stays a (signaling) NaN, as numpy does for f16.
// fn formats have a single NaN per sign.
inline uint32_t encode_nan(double d, const NarrowFmt& f) {
  const uint64_t b = f64_bits(d);
  const uint32_t sign = (b >> 63) ? f.sign_bit() : 0;
  if (f.fn) return sign | f.quiet_nan();
  uint32_t payload = static_cast<uint32_t>((b & ((uint64_t{1} << 52) - 1)) >> (52 - f.mb));
  if (payload == 0) payload = 1;
  return sign | f.exp_mask() | payload;
}

// Exact decode of a narrow format into a double. NaN: payload shifted to the top (exact embedding).
inline double decode_narrow(uint32_t bits, const NarrowFmt& f) {
  const bool neg = bits & f.sign_bit();
  const uint32_t E = (bits >> f.mb) & ((1u << f.eb) - 1);
  const uint32_t M = bits & ((1u << f.mb) - 1);
  const uint64_t sign = neg ? (uint64_t{1} << 63) : 0;
  const bool all_ones = E == (1u << f.eb) - 1;
  if (all_ones && (!f.fn || M == (1u << f.mb) - 1)) {
    if (!f.fn && M == 0) return f64_from(sign | (uint64_t{0x7FF} << 52));
    return f64_from(sign | (uint64_t{0x7FF} << 52) | (static_cast<uint64_t>(M) << (52 - f.mb)));
  }
  double v;
  if (E == 0) {
    v = std::ldexp(static_cast<double>(M), 1 - f.bias() - f.mb);
  } else {
    const uint64_t exp = static_cast<uint64_t>(static_cast<int>(E) - f.bias() + 1023);
    v = f64_from((exp << 52) | (static_cast<uint64_t>(M) << (52 - f.mb)));
  }
  return neg ? -v : v;
}

// f32 <-> f64 keeping NaN payloads bit for bit (hardware conversion would quiet a signaling NaN).
inline double f32_to_f64_exact(float f) {
  const uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u)
    return f64_from((static_cast<uint64_t>(u >> 31) << 63) | (uint64_t{0x7FF} << 52) |
                    (static_cast<uint64_t>(u & 0x7FFFFFu) << 29));
  return static_cast<double>(f);
}
inline float f64_nan_to_f32(double d) {
  const uint64_t b = f64_bits(d);
  uint32_t payload = static_cast<uint32_t>((b & ((uint64_t{1} << 52) - 1)) >> 29);
  if (payload == 0) payload = 1;
  return f32_from((static_cast<uint32_t>(b >> 63) << 31) | 0x7F800000u | payload);
}

// ---------------------------------------------------------------------------------------------
// Per-dtype traits for the scalar path.

enum class Cat : uint8_t { kBool, kSigned, kUnsigned, kFloat };

template <DType T> struct Tr;
#define CKPT_TR(DT, STORE, CAT)        \
  template <> struct Tr<DType::DT> {   \
    using S = STORE;                   \
    static constexpr Cat cat = Cat::CAT; \
  };
CKPT_TR(kBool, uint8_t, kBool)
CKPT_TR(kU8, uint8_t, kUnsigned)
CKPT_TR(kI8, int8_t, kSigned)
CKPT_TR(kI16, int16_t, kSigned)
CKPT_TR(kU16, uint16_t, kUnsigned)
CKPT_TR(kI32, int32_t, kSigned)
CKPT_TR(kU32, uint32_t, kUnsigned)
CKPT_TR(kI64, int64_t, kSigned)
CKPT_TR(kU64, uint64_t, kUnsigned)
CKPT_TR(kF16, uint16_t, kFloat)
CKPT_TR(kBF16, uint16_t, kFloat)
CKPT_TR(kF32, float, kFloat)
CKPT_TR(kF64, double, kFloat)
CKPT_TR(kF8E4M3, uint8_t, kFloat)
CKPT_TR(kF8E5M2, uint8_t, kFloat)
#undef CKPT_TR

template <DType T> constexpr const NarrowFmt* narrow_fmt() {
  if constexpr (T == DType::kF16) return &kFmtF16;
  else if constexpr (T == DType::kBF16) return &kFmtBF16;
  else if constexpr (T == DType::kF8E4M3) return &kFmtE4M3;
  else if constexpr (T == DType::kF8E5M2) return &kFmtE5M2;
  else return nullptr;
}

template <DType T> inline typename Tr<T>::S load(const uint8_t* p) {
  typename Tr<T>::S v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <DType T> inline void store(uint8_t* p, typename Tr<T>::S v) { std::memcpy(p, &v, sizeof v); }

// Exact value of a float element as a double (NaN payload embedded).
template <DType F> inline double load_float(const uint8_t* p) {
  if constexpr (F == DType::kF64) return load<F>(p);
  else if constexpr (F == DType::kF32) return f32_to_f64_exact(load<F>(p));
  else return decode_narrow(load<F>(p), *narrow_fmt<F>());
}

template <typename S> constexpr __int128 int_min() { return static_cast<__int128>(std::numeric_limits<S>::min()); }
template <typename S> constexpr __int128 int_max() { return static_cast<__int128>(std::numeric_limits<S>::max()); }

// Largest finite value of a float dtype, as a double.
template <DType T> inline double max_finite() {
  if constexpr (T == DType::kF64) return std::numeric_limits<double>::max();
  else if constexpr (T == DType::kF32) return std::numeric_limits<float>::max();
  else return decode_narrow(narrow_fmt<T>()->max_finite(), *narrow_fmt<T>());
}
template <DType T> inline int significand_bits() {
  if constexpr (T == DType::kF64) return 53;
  else if constexpr (T == DType::kF32) return 24;
  else return narrow_fmt<T>()->mb + 1;
}

// Stores a double known to be exactly representable (or NaN/Inf/overflowing, see `enc`) into a
// float dtype with one rounding. Returns overflow for a finite value beyond max finite (and Inf
// into an fn format); the stored bits are then Inf/NaN, the caller saturates if asked.
template <DType T> inline Enc store_float(uint8_t* p, double d) {
  Enc enc = Enc::kOk;
  if constexpr (T == DType::kF64) {
    store<T>(p, d);
  } else if constexpr (T == DType::kF32) {
    if (std::isnan(d)) { store<T>(p, f64_nan_to_f32(d)); return enc; }
    const float f = static_cast<float>(d);
    if (std::isinf(f) && !std::isinf(d)) enc = Enc::kOverflow;
    store<T>(p, f);
  } else {
    const NarrowFmt& f = *narrow_fmt<T>();
    uint32_t bits = std::isnan(d) ? encode_nan(d, f) : encode_narrow(d, f, &enc);
    store<T>(p, static_cast<typename Tr<T>::S>(bits));
  }
  return enc;
}
template <DType T> inline void store_saturated(uint8_t* p, bool negative) {
  if constexpr (T == DType::kF64 || T == DType::kF32) {
    store<T>(p, negative ? -std::numeric_limits<typename Tr<T>::S>::max() : std::numeric_limits<typename Tr<T>::S>::max());
  } else {
    const NarrowFmt& f = *narrow_fmt<T>();
    store<T>(p, static_cast<typename Tr<T>::S>((negative ? f.sign_bit() : 0) | f.max_finite()));
  }
}

// What the scalar path met, per reason; the first index of each reason.
struct Counters {
  uint64_t overflowed = 0, nans = 0, rejected_nans = 0, inexact = 0, invalid_bool = 0;
  int64_t first_overflow = -1, first_nan = -1, first_inexact = -1, first_invalid = -1, first_bad = -1;
  double first_overflow_value = 0, first_inexact_value = 0;
  int first_invalid_byte = 0;
};

inline void note_bad(Counters& c, int64_t i) {
  if (c.first_bad < 0 || i < c.first_bad) c.first_bad = i;
}

// The exact scalar cast of one block: `n` elements, global index of the first is `base`.
template <DType F, DType T>
void cast_block(const uint8_t* src, uint8_t* dst, size_t n, int64_t base, const CastOptions& o,
                Counters& c) {
  constexpr size_t fs = sizeof(typename Tr<F>::S), ts = sizeof(typename Tr<T>::S);
  constexpr Cat fc = Tr<F>::cat, tc = Tr<T>::cat;
  const bool sat = o.overflow == OverflowPolicy::kSaturate;
  for (size_t k = 0; k < n; ++k) {
    const uint8_t* s = src + k * fs;
    uint8_t* d = dst + k * ts;
    const int64_t idx = base + static_cast<int64_t>(k);
    auto overflow = [&](double v) {
      ++c.overflowed;
      if (c.first_overflow < 0) { c.first_overflow = idx; c.first_overflow_value = v; }
      note_bad(c, idx);
    };
    auto inexact = [&](double v) {
      ++c.inexact;
      if (c.first_inexact < 0) { c.first_inexact = idx; c.first_inexact_value = v; }
      note_bad(c, idx);
    };
    if constexpr (fc == Cat::kFloat) {
      const double v = load_float<F>(s);
      if constexpr (tc == Cat::kFloat) {
        if (std::isnan(v)) {
          ++c.nans;
          if (!o.allow_nan) {
            ++c.rejected_nans;
            if (c.first_nan < 0) c.first_nan = idx;
            note_bad(c, idx);
          }
          (void)store_float<T>(d, v);
          continue;
        }
        if (store_float<T>(d, v) == Enc::kOverflow) {
          overflow(v);
          if (sat) store_saturated<T>(d, std::signbit(v));
        }
      } else {  // float -> integer or bool: exact or an error
        using S = typename Tr<T>::S;
        constexpr double lo = tc == Cat::kBool ? 0.0 : static_cast<double>(std::numeric_limits<S>::min());
        // 2^bits for unsigned, 2^(bits-1) for signed: exact powers of two, exclusive upper bound.
        constexpr double hi_excl = tc == Cat::kBool ? 2.0 : static_cast<double>(std::numeric_limits<S>::max() / 2 + 1) * 2.0;
        if (std::isnan(v)) {
          ++c.nans;
          ++c.rejected_nans;
          if (c.first_nan < 0) c.first_nan = idx;
          note_bad(c, idx);
          store<T>(d, S{0});
          continue;
        }
        // Out of range: below min or above max (+-Inf included). hi_excl - 1 is max when max is
        // a double; for 64-bit targets it rounds to hi_excl and `v >= hi_excl` decides.
        if (v < lo || v >= hi_excl || v > hi_excl - 1.0) {
          overflow(v);
          S r = (v < lo) ? (tc == Cat::kBool ? S{0} : std::numeric_limits<S>::min())
                         : (tc == Cat::kBool ? S{1} : std::numeric_limits<S>::max());
          store<T>(d, r);
          continue;
        }
        const double t = std::trunc(v);
        if (t != v) inexact(v);
        if constexpr (tc == Cat::kBool) store<T>(d, static_cast<S>(t != 0.0 ? 1 : 0));
        else store<T>(d, static_cast<S>(t));
      }
    } else {  // integer or bool source
      __int128 v;
      if constexpr (fc == Cat::kBool) {
        const uint8_t b = *s;
        if (b > 1) {
          ++c.invalid_bool;
          if (c.first_invalid < 0) { c.first_invalid = idx; c.first_invalid_byte = b; }
          note_bad(c, idx);
        }
        v = b != 0;
      } else {
        v = static_cast<__int128>(load<F>(s));
      }
      if constexpr (tc == Cat::kFloat) {
        const bool neg = v < 0;
        const unsigned __int128 mag = neg ? static_cast<unsigned __int128>(-v) : static_cast<unsigned __int128>(v);
        const double dv = static_cast<double>(v);  // rounded for |v| >= 2^53; used for range/messages
        if (dv > max_finite<T>() || -dv > max_finite<T>()) {
          overflow(dv);
          if (sat) store_saturated<T>(d, neg);
          else (void)store_float<T>(d, dv);
          continue;
        }
        // Exactly representable iff the odd part of |v| fits the significand (range checked above;
        // every integer <= max finite is >= the smallest normal or zero).
        unsigned __int128 odd = mag;
        while (odd != 0 && (odd & 1) == 0) odd >>= 1;
        if (odd >> significand_bits<T>()) {
          inexact(dv);
          (void)store_float<T>(d, dv);
          continue;
        }
        if (store_float<T>(d, dv) == Enc::kOverflow) {  // max finite rounding boundary
          overflow(dv);
          if (sat) store_saturated<T>(d, neg);
        }
      } else {
        using S = typename Tr<T>::S;
        const __int128 lo = tc == Cat::kBool ? 0 : int_min<S>();
        const __int128 hi = tc == Cat::kBool ? 1 : int_max<S>();
        if (v < lo || v > hi) {
          overflow(static_cast<double>(v));
          store<T>(d, static_cast<S>(v < lo ? lo : hi));
          continue;
        }
        store<T>(d, static_cast<S>(v));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Fast kernels for the hot pairs. Each converts n elements and returns nonzero when some element
// needs the exact scalar path (NaN, Inf, or overflow); the caller then redoes the block.
// They are written as plain loops the compiler vectorizes, and compiled once for the baseline ISA
// and once for AVX2 (+F16C intrinsics for f16); the variant is picked at run time.

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

// Kernel(src, dst, n, nt): nt asks for non-temporal (streaming) stores, used by the ISA kernels
// when dst is 32-byte aligned; the portable kernels ignore it.
using Kernel = uint32_t (*)(const uint8_t*, uint8_t*, size_t, bool);

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

// ---------------------------------------------------------------------------------------------
// Dispatch of the scalar path over all (from, to) pairs.

using BlockFn = void (*)(const uint8_t*, uint8_t*, size_t, int64_t, const CastOptions&, Counters&);

template <DType F>
BlockFn block_fn_to(DType to) {
  switch (to) {
    case DType::kBool: return cast_block<F, DType::kBool>;
    case DType::kU8: return cast_block<F, DType::kU8>;
    case DType::kI8: return cast_block<F, DType::kI8>;
    case DType::kI16: return cast_block<F, DType::kI16>;
    case DType::kU16: return cast_block<F, DType::kU16>;
    case DType::kI32: return cast_block<F, DType::kI32>;
    case DType::kU32: return cast_block<F, DType::kU32>;
    case DType::kI64: return cast_block<F, DType::kI64>;
    case DType::kU64: return cast_block<F, DType::kU64>;
    case DType::kF16: return cast_block<F, DType::kF16>;
    case DType::kBF16: return cast_block<F, DType::kBF16>;
    case DType::kF32: return cast_block<F, DType::kF32>;
    case DType::kF64: return cast_block<F, DType::kF64>;
    case DType::kF8E4M3: return cast_block<F, DType::kF8E4M3>;
    case DType::kF8E5M2: return cast_block<F, DType::kF8E5M2>;
  }
  return nullptr;
}

BlockFn block_fn(DType from, DType to) {
  switch (from) {
    case DType::kBool: return block_fn_to<DType::kBool>(to);
    case DType::kU8: return block_fn_to<DType::kU8>(to);
    case DType::kI8: return block_fn_to<DType::kI8>(to);
    case DType::kI16: return block_fn_to<DType::kI16>(to);
    case DType::kU16: return block_fn_to<DType::kU16>(to);
    case DType::kI32: return block_fn_to<DType::kI32>(to);
    case DType::kU32: return block_fn_to<DType::kU32>(to);
    case DType::kI64: return block_fn_to<DType::kI64>(to);
    case DType::kU64: return block_fn_to<DType::kU64>(to);
    case DType::kF16: return block_fn_to<DType::kF16>(to);
    case DType::kBF16: return block_fn_to<DType::kBF16>(to);
    case DType::kF32: return block_fn_to<DType::kF32>(to);
    case DType::kF64: return block_fn_to<DType::kF64>(to);
    case DType::kF8E4M3: return block_fn_to<DType::kF8E4M3>(to);
    case DType::kF8E5M2: return block_fn_to<DType::kF8E5M2>(to);
  }
  return nullptr;
}

bool valid_dtype(DType t) { return static_cast<unsigned>(t) < static_cast<unsigned>(kNumDTypes); }

std::string fmt_double(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// NaN scan for a same-type float copy with allow_nan == false.
template <DType F>
void count_nans(const uint8_t* src, size_t n, Counters& c) {
  for (size_t k = 0; k < n; ++k) {
    if (std::isnan(load_float<F>(src + k * sizeof(typename Tr<F>::S)))) {
      ++c.nans;
      ++c.rejected_nans;
      if (c.first_nan < 0) c.first_nan = static_cast<int64_t>(k);
      note_bad(c, static_cast<int64_t>(k));
    }
  }
}

double max_finite_of(DType t) {
  switch (t) {
    case DType::kF16: return max_finite<DType::kF16>();
    case DType::kBF16: return max_finite<DType::kBF16>();
    case DType::kF32: return max_finite<DType::kF32>();
    case DType::kF64: return max_finite<DType::kF64>();
    case DType::kF8E4M3: return max_finite<DType::kF8E4M3>();
    case DType::kF8E5M2: return max_finite<DType::kF8E5M2>();
    default: return 0;
  }
}

constexpr size_t kBlock = 4096;
// Outputs at least this large are written with streaming stores by the ISA kernels (they would
// not stay in cache anyway; this saves the read-for-ownership of the destination).
constexpr uint64_t kStreamBytes = uint64_t{8} << 20;

}  // namespace

// ---------------------------------------------------------------------------------------------
// Public scalar conversions.

float bf16_to_f32(uint16_t h) { return f32_from(static_cast<uint32_t>(h) << 16); }

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t E = (h >> 10) & 0x1Fu, M = h & 0x3FFu;
  if (E == 0x1F) return f32_from(sign | 0x7F800000u | (M << 13));
  if (E == 0) {
    const float v = static_cast<float>(M) * 0x1.0p-24f;  // exact: M < 2^10
    return f32_from(sign | f32_bits(v));
  }
  return f32_from(sign | ((E + 112u) << 23) | (M << 13));
}

uint16_t f32_to_bf16(float f) {
  const uint32_t u = f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) {  // NaN: keep sign and leading payload bits
    uint32_t payload = (u >> 16) & 0x7Fu;
    if (payload == 0) payload = 1;
    return static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7F80u | payload);
  }
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

uint16_t f32_to_f16(float f) {
  const double d = f32_to_f64_exact(f);
  if (std::isnan(d)) return static_cast<uint16_t>(encode_nan(d, kFmtF16));
  Enc enc;
  return static_cast<uint16_t>(encode_narrow(d, kFmtF16, &enc));
}

float f8e4m3_to_f32(uint8_t b) { return static_cast<float>(decode_narrow(b, kFmtE4M3)); }
float f8e5m2_to_f32(uint8_t b) { return f16_to_f32(static_cast<uint16_t>(b << 8)); }

uint8_t f32_to_f8e4m3(float f, bool saturate) {
  const double d = f32_to_f64_exact(f);
  if (std::isnan(d)) return static_cast<uint8_t>(encode_nan(d, kFmtE4M3));
  Enc enc;
  uint32_t b = encode_narrow(d, kFmtE4M3, &enc);
  if (enc == Enc::kOverflow && saturate) b = (std::signbit(d) ? 0x80u : 0u) | kFmtE4M3.max_finite();
  return static_cast<uint8_t>(b);
}
uint8_t f32_to_f8e5m2(float f, bool saturate) {
  const double d = f32_to_f64_exact(f);
  if (std::isnan(d)) return static_cast<uint8_t>(encode_nan(d, kFmtE5M2));
  Enc enc;
  uint32_t b = encode_narrow(d, kFmtE5M2, &enc);
  if (enc == Enc::kOverflow && saturate) b = (std::signbit(d) ? 0x80u : 0u) | kFmtE5M2.max_finite();
  return static_cast<uint8_t>(b);
}

void set_cast_portable_only(bool on) { g_portable_only.store(on, std::memory_order_relaxed); }

// ---------------------------------------------------------------------------------------------

Status cast_elements(const void* src_v, DType from, void* dst_v, DType to, size_t n,
                     const CastOptions& opts, CastStats* stats) {
  if (stats) *stats = CastStats{};
  if (!valid_dtype(from) || !valid_dtype(to))
    return Status::InvalidArgument("cast_elements: invalid dtype value " +
                                   std::to_string(static_cast<int>(valid_dtype(from) ? to : from)));
  const std::string pair = "cast " + std::string(dtype_name(from)) + " -> " + std::string(dtype_name(to));
  const auto in_bytes = checked_mul(uint64_t{n}, uint64_t{dtype_size(from)});
  const auto out_bytes = checked_mul(uint64_t{n}, uint64_t{dtype_size(to)});
  if (!in_bytes || !out_bytes || n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return Status::InvalidArgument(pair + ": element count " + std::to_string(n) + " overflows the byte size");
  if (n == 0) return Status::Ok();
  if (src_v == nullptr || dst_v == nullptr)
    return Status::InvalidArgument(pair + ": null buffer for " + std::to_string(n) + " elements");
  const auto* src = static_cast<const uint8_t*>(src_v);
  auto* dst = static_cast<uint8_t*>(dst_v);
  Counters c;

  if (from == to) {
    if (src != dst) std::memmove(dst, src, *in_bytes);
    if (dtype_is_float(from) && !opts.allow_nan) {
      switch (from) {
        case DType::kF16: count_nans<DType::kF16>(src, n, c); break;
        case DType::kBF16: count_nans<DType::kBF16>(src, n, c); break;
        case DType::kF32: count_nans<DType::kF32>(src, n, c); break;
        case DType::kF64: count_nans<DType::kF64>(src, n, c); break;
        case DType::kF8E4M3: count_nans<DType::kF8E4M3>(src, n, c); break;
        case DType::kF8E5M2: count_nans<DType::kF8E5M2>(src, n, c); break;
        default: break;
      }
    }
  } else {
    const uintptr_t s0 = reinterpret_cast<uintptr_t>(src), d0 = reinterpret_cast<uintptr_t>(dst);
    if (s0 < d0 + *out_bytes && d0 < s0 + *in_bytes)
      return Status::InvalidArgument(pair + ": source and destination buffers overlap");
    const size_t fs = dtype_size(from), ts = dtype_size(to);
    Kernel fast = fast_kernel(from, to);
    // bf16 <-> f16: two fast stages through an f32 block (exact, then one rounding).
    Kernel stage1 = nullptr, stage2 = nullptr;
    if (fast == nullptr && from != to && (from == DType::kBF16 || from == DType::kF16) &&
        (to == DType::kBF16 || to == DType::kF16)) {
      stage1 = fast_kernel(from, DType::kF32);
      stage2 = fast_kernel(DType::kF32, to);
    }
    const BlockFn slow = block_fn(from, to);
    if (slow == nullptr) return Status::Internal(pair + ": no cast routine");
    const bool nt = fast != nullptr && *out_bytes >= kStreamBytes;
    float tmp[kBlock];  // [kBlock] f32 between the two stages
    size_t i = 0;
    auto run = [&](size_t m, bool stream) {
      uint32_t flag = 1;
      if (fast != nullptr) {
        flag = fast(src + i * fs, dst + i * ts, m, stream);
      } else if (stage1 != nullptr) {
        auto* t = reinterpret_cast<uint8_t*>(tmp);
        flag = stage1(src + i * fs, t, m, false);
        if (flag == 0) flag = stage2(t, dst + i * ts, m, false);
      }
      if (flag != 0) slow(src + i * fs, dst + i * ts, m, static_cast<int64_t>(i), opts, c);
      i += m;
    };
    if (nt && d0 % ts == 0) {  // a head up to the first 32-byte aligned output element
      const size_t head = std::min<size_t>(((32 - d0 % 32) % 32) / ts, n);
      if (head > 0) run(head, false);
    }
    while (i < n) run(std::min(kBlock, n - i), nt);
#if CKPT_CAST_X86
    if (nt) _mm_sfence();  // order the streaming stores before the caller publishes dst
#endif
  }

  if (stats) {
    stats->overflowed = c.overflowed;
    stats->nans = c.nans;
    stats->inexact = c.inexact;
    stats->invalid_bool = c.invalid_bool;
    stats->first_bad = c.first_bad;
  }
  const bool overflow_err = c.overflowed > 0 && opts.overflow == OverflowPolicy::kError;
  if (!overflow_err && c.rejected_nans == 0 && c.inexact == 0 && c.invalid_bool == 0) return Status::Ok();

  std::string msg = pair + " of " + std::to_string(n) + " elements:";
  std::string sep = " ";
  if (overflow_err) {
    msg += sep + std::to_string(c.overflowed) + " out of range (first at index " +
           std::to_string(c.first_overflow) + ", value " + fmt_double(c.first_overflow_value) + ")";
    if (dtype_is_float(to)) msg += ", target max finite " + fmt_double(max_finite_of(to));
    sep = "; ";
  }
  if (c.rejected_nans > 0) {
    msg += sep + std::to_string(c.rejected_nans) + " NaN (first at index " + std::to_string(c.first_nan) + ")" +
           (dtype_is_float(to) ? " not allowed" : ", which an integer type cannot hold");
    sep = "; ";
  }
  if (c.inexact > 0) {
    msg += sep + std::to_string(c.inexact) + " not exactly representable (first at index " +
           std::to_string(c.first_inexact) + ", value " + fmt_double(c.first_inexact_value) + ")";
    sep = "; ";
  }
  if (c.invalid_bool > 0) {
    msg += sep + std::to_string(c.invalid_bool) + " BOOL bytes not 0 or 1 (first at index " +
           std::to_string(c.first_invalid) + ", byte " + std::to_string(c.first_invalid_byte) + ")";
  }
  if (overflow_err) msg += " (saturation clamps out-of-range values to the target's limits)";
  const char* code = overflow_err ? "CastOverflow"
                     : c.rejected_nans > 0 ? "CastNaN"
                     : c.inexact > 0 ? "CastInexact"
                                     : "CastInvalidBool";
  return Status::Error(code, msg);  // CastInvalidBool is corruption, the others overflow
}

}  // namespace ckpt
