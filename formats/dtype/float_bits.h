// Bit-level float formats for the casts (formats/dtype/dtype_cast.cc, formats/dtype/cast_scalar.cc,
// formats/dtype/cast_kernels.cc): the narrow binary formats (f16, bf16, float8 e4m3fn / e5m2) as
// exponent and mantissa widths, exact decoding into a double, rounding once to nearest even
// from a double, NaN payload rules, and f32 <-> f64 keeping NaN payloads bit for bit.
// Internal to formats/; pure inline functions; thread safe.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace ckpt::cast_detail {

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
inline constexpr NarrowFmt kFmtF16{5, 10, false};
inline constexpr NarrowFmt kFmtBF16{8, 7, false};
inline constexpr NarrowFmt kFmtE4M3{4, 3, true};
inline constexpr NarrowFmt kFmtE5M2{5, 2, false};

enum class Enc : uint8_t { kOk, kOverflow, kUnrepresentable };  // kUnrepresentable: zero/negative into F8_E8M0

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

}  // namespace ckpt::cast_detail
