// Tests of the rules of formats/dtype/dtype.h casts: rounding once, the error and saturation policy,
// NaN, float <-> integer and BOOL rules, argument validation, stats, and every dtype pair.
// Expected values are written out by hand (IEEE bit patterns, integer limits).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "formats/dtype/dtype.h"

namespace ckpt {
namespace {

TEST(DTypeCast, F64ToF16RoundsOnce) {
  // 1 + 2^-11 is the f16 tie between 1 and 1 + 2^-10; a hair above must round up. Through f32,
  // 1 + 2^-11 + 2^-40 becomes the exact tie and rounds to even (1.0): double rounding.
  const double x = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  uint16_t h;
  ASSERT_TRUE(cast_elements(&x, DType::kF64, &h, DType::kF16, 1).ok());
  EXPECT_EQ(h, 0x3C01);
  EXPECT_EQ(f32_to_f16(static_cast<float>(x)), 0x3C00);  // what double rounding would give
  uint16_t b;
  const double y = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40);  // same for bf16
  ASSERT_TRUE(cast_elements(&y, DType::kF64, &b, DType::kBF16, 1).ok());
  EXPECT_EQ(b, 0x3F81);
}

TEST(DTypeCast, E4M3InfIsOverflowNaNIsNaN) {
  const float x[4] = {INFINITY, -NAN, 448.f, -500.f};
  uint8_t out[4];
  CastStats st;
  Status s = cast_elements(x, DType::kF32, out, DType::kF8E4M3, 4, {}, &st);
  EXPECT_EQ(s.code(), "CastOverflow");
  EXPECT_EQ(st.overflowed, 2u);
  EXPECT_EQ(st.nans, 1u);
  EXPECT_EQ(st.first_bad, 0);
  ASSERT_TRUE(cast_elements(x, DType::kF32, out, DType::kF8E4M3, 4, {OverflowPolicy::kSaturate, true}).ok());
  EXPECT_EQ(out[0], 0x7E);
  EXPECT_EQ(out[1], 0xFF);
  EXPECT_EQ(out[2], 0x7E);
  EXPECT_EQ(out[3], 0xFE);
}

TEST(DTypeCast, NaNPolicy) {
  const float x[3] = {1.f, NAN, 2.f};
  uint16_t out[3];
  float same[3];
  CastStats st;
  EXPECT_TRUE(cast_elements(x, DType::kF32, out, DType::kBF16, 3, {}, &st).ok());
  EXPECT_EQ(st.nans, 1u);
  EXPECT_EQ(st.first_bad, -1);
  Status s = cast_elements(x, DType::kF32, out, DType::kBF16, 3, {OverflowPolicy::kError, false}, &st);
  EXPECT_EQ(s.kind(), ErrorKind::kOverflow);
  EXPECT_EQ(s.code(), "CastNaN");
  EXPECT_EQ(st.first_bad, 1);
  s = cast_elements(x, DType::kF32, same, DType::kF32, 3, {OverflowPolicy::kSaturate, false}, &st);
  EXPECT_EQ(s.code(), "CastNaN");
  EXPECT_EQ(std::memcmp(x, same, sizeof x), 0);
  // NaN into an integer: always an error
  int32_t i[3];
  s = cast_elements(x, DType::kF32, i, DType::kI32, 3, {OverflowPolicy::kSaturate, true}, &st);
  EXPECT_EQ(s.code(), "CastNaN");
}

TEST(DTypeCast, FloatToIntIsStrict) {
  const double x[] = {3.0, -2.0, 2.5, 127.0, 128.0, -128.0, -129.0, -0.0, 1e300, -INFINITY};
  int8_t out[10];
  CastStats st;
  Status s = cast_elements(x, DType::kF64, out, DType::kI8, 10, {}, &st);
  EXPECT_EQ(s.kind(), ErrorKind::kOverflow);
  EXPECT_EQ(s.code(), "CastOverflow");
  EXPECT_EQ(st.overflowed, 4u);  // 128, -129, 1e300, -Inf
  EXPECT_EQ(st.inexact, 1u);     // 2.5
  EXPECT_EQ(st.first_bad, 2);
  s = cast_elements(x, DType::kF64, out, DType::kI8, 10, {OverflowPolicy::kSaturate, true}, &st);
  EXPECT_EQ(s.code(), "CastInexact");  // saturation does not excuse a fraction
  const int8_t want[] = {3, -2, 2, 127, 127, -128, -128, 0, 127, -128};
  for (int k = 0; k < 10; ++k) EXPECT_EQ(out[k], want[k]) << k;
  // 64-bit edges: 2^63 is out of range for I64, -2^63 is in, 2^64 out for U64
  const double e[] = {9223372036854775808.0, -9223372036854775808.0, 18446744073709551616.0,
                      18446744073709549568.0};
  int64_t i64[2];
  ASSERT_EQ(cast_elements(e, DType::kF64, i64, DType::kI64, 2, {}, &st).code(), "CastOverflow");
  EXPECT_EQ(st.overflowed, 1u);
  EXPECT_EQ(i64[1], std::numeric_limits<int64_t>::min());
  uint64_t u64[2];
  ASSERT_EQ(cast_elements(e + 2, DType::kF64, u64, DType::kU64, 2, {}, &st).code(), "CastOverflow");
  EXPECT_EQ(st.first_bad, 0);
  EXPECT_EQ(u64[1], 18446744073709549568ull);
}

TEST(DTypeCast, IntToFloatExactOrError) {
  const int64_t x[] = {16777216, 16777217, -16777218, (int64_t{1} << 62), -7};
  float out[5];
  CastStats st;
  Status s = cast_elements(x, DType::kI64, out, DType::kF32, 5, {}, &st);
  EXPECT_EQ(s.code(), "CastInexact");
  EXPECT_EQ(st.inexact, 1u);
  EXPECT_EQ(st.first_bad, 1);
  EXPECT_EQ(out[2], -16777218.0f);
  EXPECT_EQ(out[3], std::ldexp(1.0f, 62));
  const int32_t y[] = {65504, 65505, 65536, -70000, 2048, 2049};
  uint16_t h[6];
  s = cast_elements(y, DType::kI32, h, DType::kF16, 6, {}, &st);
  EXPECT_EQ(s.code(), "CastOverflow");
  EXPECT_EQ(st.overflowed, 3u);
  EXPECT_EQ(st.inexact, 1u);  // 2049
  s = cast_elements(y, DType::kI32, h, DType::kF16, 4, {OverflowPolicy::kSaturate, true}, &st);
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(h[0], 0x7BFF);
  EXPECT_EQ(h[1], 0x7BFF);
  EXPECT_EQ(h[3], 0xFBFF);
  const uint64_t big = ~uint64_t{0};
  double d;
  EXPECT_EQ(cast_elements(&big, DType::kU64, &d, DType::kF64, 1).code(), "CastInexact");
  const uint64_t p63 = uint64_t{1} << 63;
  ASSERT_TRUE(cast_elements(&p63, DType::kU64, &d, DType::kF64, 1).ok());
  EXPECT_EQ(d, 9223372036854775808.0);
}

TEST(DTypeCast, IntToIntRangeAndSaturation) {
  const int64_t x[] = {-1, 0, 255, 256, std::numeric_limits<int64_t>::min()};
  uint8_t out[5];
  CastStats st;
  Status s = cast_elements(x, DType::kI64, out, DType::kU8, 5, {}, &st);
  EXPECT_EQ(s.code(), "CastOverflow");
  EXPECT_EQ(st.overflowed, 3u);
  EXPECT_EQ(st.first_bad, 0);
  ASSERT_TRUE(cast_elements(x, DType::kI64, out, DType::kU8, 5, {OverflowPolicy::kSaturate, true}).ok());
  const uint8_t want[] = {0, 0, 255, 255, 0};
  EXPECT_EQ(std::memcmp(out, want, 5), 0);
  const uint64_t u[] = {~uint64_t{0}, 5};
  int64_t i[2];
  EXPECT_EQ(cast_elements(u, DType::kU64, i, DType::kI64, 2, {}, &st).code(), "CastOverflow");
  EXPECT_EQ(i[1], 5);
}

TEST(DTypeCast, BoolRules) {
  const uint8_t b[] = {0, 1, 2};
  float f[3];
  CastStats st;
  Status s = cast_elements(b, DType::kBool, f, DType::kF32, 3, {OverflowPolicy::kSaturate, true}, &st);
  EXPECT_EQ(s.kind(), ErrorKind::kCorruption);
  EXPECT_EQ(s.code(), "CastInvalidBool");
  EXPECT_EQ(st.invalid_bool, 1u);
  EXPECT_EQ(st.first_bad, 2);
  ASSERT_TRUE(cast_elements(b, DType::kBool, f, DType::kF32, 2).ok());
  EXPECT_EQ(f[0], 0.f);
  EXPECT_EQ(f[1], 1.f);
  const int32_t i[] = {0, 1, 5, -1};
  uint8_t o[4];
  EXPECT_EQ(cast_elements(i, DType::kI32, o, DType::kBool, 4, {}, &st).code(), "CastOverflow");
  EXPECT_EQ(st.overflowed, 2u);
  ASSERT_TRUE(cast_elements(i, DType::kI32, o, DType::kBool, 4, {OverflowPolicy::kSaturate, true}).ok());
  EXPECT_EQ(o[2], 1);
  EXPECT_EQ(o[3], 0);
}

TEST(DTypeCast, ArgumentValidation) {
  float a[4] = {1, 2, 3, 4};
  uint16_t h[4];
  EXPECT_EQ(cast_elements(nullptr, DType::kF32, h, DType::kF16, 4).kind(), ErrorKind::kInvalidArgument);
  EXPECT_EQ(cast_elements(a, DType::kF32, nullptr, DType::kF16, 4).kind(), ErrorKind::kInvalidArgument);
  EXPECT_TRUE(cast_elements(nullptr, DType::kF32, nullptr, DType::kF16, 0).ok());
  EXPECT_EQ(cast_elements(a, DType::kF32, a, DType::kF16, 4).kind(), ErrorKind::kInvalidArgument);  // overlap
  EXPECT_EQ(cast_elements(a, static_cast<DType>(200), h, DType::kF16, 4).kind(), ErrorKind::kInvalidArgument);
  EXPECT_EQ(cast_elements(a, DType::kF32, h, static_cast<DType>(kNumDTypes), 4).kind(),
            ErrorKind::kInvalidArgument);
  EXPECT_EQ(cast_elements(a, DType::kF32, h, DType::kF16, std::numeric_limits<size_t>::max() / 2).kind(),
            ErrorKind::kInvalidArgument);
  // same type: a copy, in place allowed
  EXPECT_TRUE(cast_elements(a, DType::kF32, a, DType::kF32, 4).ok());
  EXPECT_EQ(a[3], 4.f);
}

TEST(DTypeCast, StatsFilledOnFailureAndResetOnSuccess) {
  CastStats st;
  st.overflowed = 99;
  const float x[2] = {1.f, 2.f};
  uint16_t h[2];
  ASSERT_TRUE(cast_elements(x, DType::kF32, h, DType::kF16, 2, {}, &st).ok());
  EXPECT_EQ(st.overflowed, 0u);
  EXPECT_EQ(st.first_bad, -1);
}

TEST(DTypeCast, EveryPairRunsAndIdentityPairsCopy) {
  // Every (from, to) pair on small in-range values: 0, 1, 2, 3 convert exactly everywhere.
  for (int f = 0; f < kNumDTypes; ++f) {
    for (int t = 0; t < kNumDTypes; ++t) {
      const DType from = static_cast<DType>(f), to = static_cast<DType>(t);
      if ((from == DType::kF4) != (to == DType::kF4)) {  // packed pairs: f4_unpack / f4_pack (dtype_low_precision_test.cc)
        uint8_t a[8] = {}, b[8];
        EXPECT_EQ(cast_elements(a, from, b, to, 2).code(), "F4Packed");
        continue;
      }
      if (from == DType::kF4) continue;
      // F8_E8M0 holds positive powers of two only.
      const bool e8 = from == DType::kF8E8M0 || to == DType::kF8E8M0;
      const double vals[4] = {e8 ? 1.0 : 0.0, 1, e8 ? 1.0 : 0.0, 1};
      uint8_t src[32], mid[32];
      double back[4];
      ASSERT_TRUE(cast_elements(vals, DType::kF64, src, from, 4).ok()) << dtype_name(from);
      ASSERT_TRUE(cast_elements(src, from, mid, to, 4).ok()) << dtype_name(from) << "->" << dtype_name(to);
      ASSERT_TRUE(cast_elements(mid, to, back, DType::kF64, 4).ok());
      EXPECT_EQ(std::memcmp(vals, back, sizeof vals), 0) << dtype_name(from) << "->" << dtype_name(to);
    }
  }
}

}  // namespace
}  // namespace ckpt
