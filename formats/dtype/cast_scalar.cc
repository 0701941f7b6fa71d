#include "formats/dtype/cast_scalar.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "formats/dtype/float_bits.h"

// The per-element routines are inlined into each pair's block loop, as one function was before.
#define CKPT_SCALAR_INLINE inline __attribute__((always_inline))

namespace ckpt::cast_detail {

namespace {

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
CKPT_TR(kF8E8M0, uint8_t, kFloat)
#undef CKPT_TR

// F8_E8M0 (float8_e8m0fnu): unsigned, exponent only, bias 127, 0xFF NaN.
inline double decode_e8m0(uint8_t b) {
  return b == 0xFF ? std::numeric_limits<double>::quiet_NaN() : std::ldexp(1.0, static_cast<int>(b) - 127);
}
// Rounds a non-NaN double into E8M0 (dtype.h: m * 2^e becomes 2^(e+1) when m >= 1.5, torch's and
// ml_dtypes' rule). kUnrepresentable for zero and negatives (stored as NaN), kOverflow beyond 2^127.
inline Enc encode_e8m0(double d, uint8_t* out) {
  *out = 0xFF;
  if (!(d > 0)) return Enc::kUnrepresentable;
  if (std::isinf(d)) return Enc::kOverflow;
  if (d < 0x1p-126) {  // torch's rule on f32 subnormals: above 2^-127 rounds up
    *out = d > 0x1p-127 ? 1 : 0;
    return Enc::kOk;
  }
  int e2 = 0;
  const double m = std::frexp(d, &e2);  // d = m * 2^e2, 0.5 <= m < 1
  const int code = (e2 - 1) + 127 + (m >= 0.75 ? 1 : 0);
  if (code > 254) return Enc::kOverflow;
  *out = static_cast<uint8_t>(code);
  return Enc::kOk;
}

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
  else if constexpr (F == DType::kF8E8M0) return decode_e8m0(*p);
  else if constexpr (F == DType::kF32) return f32_to_f64_exact(load<F>(p));
  else return decode_narrow(load<F>(p), *narrow_fmt<F>());
}

template <typename S> constexpr __int128 int_min() { return static_cast<__int128>(std::numeric_limits<S>::min()); }
template <typename S> constexpr __int128 int_max() { return static_cast<__int128>(std::numeric_limits<S>::max()); }

// Largest finite value of a float dtype, as a double.
template <DType T> inline double max_finite() {
  if constexpr (T == DType::kF64) return std::numeric_limits<double>::max();
  else if constexpr (T == DType::kF8E8M0) return 0x1p127;
  else if constexpr (T == DType::kF32) return std::numeric_limits<float>::max();
  else return decode_narrow(narrow_fmt<T>()->max_finite(), *narrow_fmt<T>());
}
template <DType T> inline int significand_bits() {
  if constexpr (T == DType::kF64) return 53;
  else if constexpr (T == DType::kF8E8M0) return 1;
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
  } else if constexpr (T == DType::kF8E8M0) {
    if (!std::isnan(d)) enc = encode_e8m0(d, p);
    else *p = 0xFF;
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
  } else if constexpr (T == DType::kF8E8M0) {
    (void)negative;
    store<T>(p, uint8_t{254});
  } else {
    const NarrowFmt& f = *narrow_fmt<T>();
    store<T>(p, static_cast<typename Tr<T>::S>((negative ? f.sign_bit() : 0) | f.max_finite()));
  }
}

inline void note_bad(Counters& c, int64_t i) {
  if (c.first_bad < 0 || i < c.first_bad) c.first_bad = i;
}
inline void note_overflow(Counters& c, int64_t idx, double v) {
  ++c.overflowed;
  if (c.first_overflow < 0) { c.first_overflow = idx; c.first_overflow_value = v; }
  note_bad(c, idx);
}
inline void note_inexact(Counters& c, int64_t idx, double v) {
  ++c.inexact;
  if (c.first_inexact < 0) { c.first_inexact = idx; c.first_inexact_value = v; }
  note_bad(c, idx);
}

// Float source, one element at index `idx`.
template <DType F, DType T>
CKPT_SCALAR_INLINE void cast_float_element(const uint8_t* s, uint8_t* d, int64_t idx, const CastOptions& o,
                                           Counters& c) {
  constexpr Cat tc = Tr<T>::cat;
  const bool sat = o.overflow == OverflowPolicy::kSaturate;
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
      return;
    }
    const Enc enc = store_float<T>(d, v);
    if (enc == Enc::kOverflow) {
      note_overflow(c, idx, v);
      if (sat) store_saturated<T>(d, std::signbit(v));
    } else if (enc == Enc::kUnrepresentable) {
      note_inexact(c, idx, v);
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
      return;
    }
    // Out of range: below min or above max (+-Inf included). hi_excl - 1 is max when max is
    // a double; for 64-bit targets it rounds to hi_excl and `v >= hi_excl` decides.
    if (v < lo || v >= hi_excl || v > hi_excl - 1.0) {
      note_overflow(c, idx, v);
      S r = (v < lo) ? (tc == Cat::kBool ? S{0} : std::numeric_limits<S>::min())
                     : (tc == Cat::kBool ? S{1} : std::numeric_limits<S>::max());
      store<T>(d, r);
      return;
    }
    const double t = std::trunc(v);
    if (t != v) note_inexact(c, idx, v);
    if constexpr (tc == Cat::kBool) store<T>(d, static_cast<S>(t != 0.0 ? 1 : 0));
    else store<T>(d, static_cast<S>(t));
  }
}

// Integer or bool source, one element at index `idx`.
template <DType F, DType T>
CKPT_SCALAR_INLINE void cast_int_element(const uint8_t* s, uint8_t* d, int64_t idx, const CastOptions& o,
                                         Counters& c) {
  constexpr Cat fc = Tr<F>::cat, tc = Tr<T>::cat;
  const bool sat = o.overflow == OverflowPolicy::kSaturate;
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
      note_overflow(c, idx, dv);
      if (sat) store_saturated<T>(d, neg);
      else (void)store_float<T>(d, dv);
      return;
    }
    // Exactly representable iff the odd part of |v| fits the significand (range checked above;
    // every integer <= max finite is >= the smallest normal or zero).
    unsigned __int128 odd = mag;
    while (odd != 0 && (odd & 1) == 0) odd >>= 1;
    if (odd >> significand_bits<T>()) {
      note_inexact(c, idx, dv);
      (void)store_float<T>(d, dv);
      return;
    }
    const Enc enc = store_float<T>(d, dv);
    if (enc == Enc::kOverflow) {  // max finite rounding boundary
      note_overflow(c, idx, dv);
      if (sat) store_saturated<T>(d, neg);
    } else if (enc == Enc::kUnrepresentable) {  // zero or negative into F8_E8M0
      note_inexact(c, idx, dv);
    }
  } else {
    using S = typename Tr<T>::S;
    const __int128 lo = tc == Cat::kBool ? 0 : int_min<S>();
    const __int128 hi = tc == Cat::kBool ? 1 : int_max<S>();
    if (v < lo || v > hi) {
      note_overflow(c, idx, static_cast<double>(v));
      store<T>(d, static_cast<S>(v < lo ? lo : hi));
      return;
    }
    store<T>(d, static_cast<S>(v));
  }
}

// The exact scalar cast of one block: `n` elements, global index of the first is `base`.
template <DType F, DType T>
void cast_block(const uint8_t* src, uint8_t* dst, size_t n, int64_t base, const CastOptions& o,
                Counters& c) {
  constexpr size_t fs = sizeof(typename Tr<F>::S), ts = sizeof(typename Tr<T>::S);
  for (size_t k = 0; k < n; ++k) {
    const int64_t idx = base + static_cast<int64_t>(k);
    if constexpr (Tr<F>::cat == Cat::kFloat) cast_float_element<F, T>(src + k * fs, dst + k * ts, idx, o, c);
    else cast_int_element<F, T>(src + k * fs, dst + k * ts, idx, o, c);
  }
}

// NaN scan for a same-type float copy with allow_nan == false.
template <DType F>
void count_nans_of(const uint8_t* src, size_t n, Counters& c) {
  for (size_t k = 0; k < n; ++k) {
    if (std::isnan(load_float<F>(src + k * sizeof(typename Tr<F>::S)))) {
      ++c.nans;
      ++c.rejected_nans;
      if (c.first_nan < 0) c.first_nan = static_cast<int64_t>(k);
      note_bad(c, static_cast<int64_t>(k));
    }
  }
}

// Dispatch of the scalar path over all (from, to) pairs.
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
    case DType::kF8E8M0: return cast_block<F, DType::kF8E8M0>;
    case DType::kF4: return nullptr;  // packed pairs: f4_unpack / f4_pack
  }
  return nullptr;
}

}  // namespace

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
    case DType::kF8E8M0: return block_fn_to<DType::kF8E8M0>(to);
    case DType::kF4: return nullptr;
  }
  return nullptr;
}

void count_nans(DType t, const uint8_t* src, size_t n, Counters& c) {
  switch (t) {
    case DType::kF16: count_nans_of<DType::kF16>(src, n, c); break;
    case DType::kBF16: count_nans_of<DType::kBF16>(src, n, c); break;
    case DType::kF32: count_nans_of<DType::kF32>(src, n, c); break;
    case DType::kF64: count_nans_of<DType::kF64>(src, n, c); break;
    case DType::kF8E4M3: count_nans_of<DType::kF8E4M3>(src, n, c); break;
    case DType::kF8E5M2: count_nans_of<DType::kF8E5M2>(src, n, c); break;
    case DType::kF8E8M0: count_nans_of<DType::kF8E8M0>(src, n, c); break;
    default: break;
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
    case DType::kF8E8M0: return max_finite<DType::kF8E8M0>();
    case DType::kF4: return 6.0;
    default: return 0;
  }
}

}  // namespace ckpt::cast_detail
