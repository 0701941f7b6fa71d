// F8_E8M0 and F4 (formats/dtype/dtype.h): the rules the Python tests cannot reach through
// cast_tool (F4Packed, the stats, int sources); values are checked bit for bit against
// ml_dtypes / torch in tests/python/test_low_precision_dtypes.py.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "formats/dtype/dtype.h"

namespace ckpt {
namespace {

TEST(LowPrecision, NamesAndSizes) {
  EXPECT_EQ(dtype_name(DType::kF8E8M0), "F8_E8M0");
  EXPECT_EQ(dtype_name(DType::kF4), "F4");
  EXPECT_EQ(*dtype_from_name("F4"), DType::kF4);
  EXPECT_EQ(dtype_size(DType::kF4), 1u);  // a packed pair
  EXPECT_EQ(dtype_values_per_element(DType::kF4), 2);
  EXPECT_EQ(dtype_values_per_element(DType::kF8E8M0), 1);
}

TEST(LowPrecision, F4CastThroughCastElementsIsRefused) {
  uint8_t a[4] = {0x21, 0, 0, 0};
  float f[8];
  EXPECT_EQ(cast_elements(a, DType::kF4, f, DType::kF32, 2).code(), "F4Packed");
  EXPECT_EQ(cast_elements(f, DType::kF32, a, DType::kF4, 2).code(), "F4Packed");
  uint8_t b[4];
  EXPECT_TRUE(cast_elements(a, DType::kF4, b, DType::kF4, 4).ok());  // a byte copy
}

TEST(LowPrecision, F4UnpackLowNibbleFirst) {
  const uint8_t packed[2] = {0x71, 0xF8};  // (0.5, 6), (-0, -6)
  float out[4];
  ASSERT_TRUE(f4_unpack(packed, 2, out, DType::kF32).ok());
  EXPECT_EQ(out[0], 0.5f);
  EXPECT_EQ(out[1], 6.0f);
  EXPECT_TRUE(out[2] == 0.0f && std::signbit(out[2]));
  EXPECT_EQ(out[3], -6.0f);
}

TEST(LowPrecision, F4PackRoundsToNearestEvenAndCounts) {
  const float in[8] = {0.25f, 0.75f, 2.5f, 5.0f, 6.9f, -7.0f, 1.25f, -0.0f};
  uint8_t out[4];
  CastStats st;
  Status s = f4_pack(in, DType::kF32, 4, out, {}, &st);
  EXPECT_EQ(s.code(), "CastOverflow");  // -7 is a tie between 6 and 8: to even, 8, beyond 6
  EXPECT_EQ(st.overflowed, 1u);
  EXPECT_EQ(st.first_bad, 5);
  CastOptions sat;
  sat.overflow = OverflowPolicy::kSaturate;
  ASSERT_TRUE(f4_pack(in, DType::kF32, 4, out, sat).ok());
  // 0.25 -> 0 (tie, even), 0.75 -> 1 (tie, even: code 2), 2.5 -> 2 (code 4), 5 -> 4 (code 6),
  // 6.9 -> 6 (code 7), -7 -> -6 saturated (code 15), 1.25 -> 1 (code 2), -0 -> code 8.
  EXPECT_EQ(out[0], 0x20);
  EXPECT_EQ(out[1], 0x64);
  EXPECT_EQ(out[2], 0xF7);
  EXPECT_EQ(out[3], 0x82);
  const float nan[2] = {NAN, 1.0f};
  EXPECT_EQ(f4_pack(nan, DType::kF32, 1, out, sat).code(), "CastNaN");
}

TEST(LowPrecision, E8M0FromIntegersAndRefusals) {
  const int32_t ints[3] = {1, 4, 1024};
  uint8_t e[3];
  ASSERT_TRUE(cast_elements(ints, DType::kI32, e, DType::kF8E8M0, 3).ok());
  EXPECT_EQ(e[0], 127);
  EXPECT_EQ(e[1], 129);
  EXPECT_EQ(e[2], 137);
  const int32_t bad[2] = {3, 0};  // 3 is not a power of two, 0 no power at all
  CastStats st;
  EXPECT_EQ(cast_elements(bad, DType::kI32, e, DType::kF8E8M0, 2, {}, &st).code(), "CastInexact");
  EXPECT_EQ(st.inexact, 2u);
  const float neg[1] = {-2.0f};
  EXPECT_EQ(cast_elements(neg, DType::kF32, e, DType::kF8E8M0, 1).code(), "CastInexact");
  const float inf[1] = {INFINITY};
  EXPECT_EQ(cast_elements(inf, DType::kF32, e, DType::kF8E8M0, 1).code(), "CastOverflow");
  CastOptions sat;
  sat.overflow = OverflowPolicy::kSaturate;
  ASSERT_TRUE(cast_elements(inf, DType::kF32, e, DType::kF8E8M0, 1, sat).ok());
  EXPECT_EQ(e[0], 254);
  const uint8_t codes[3] = {0, 127, 255};
  float f[3];
  ASSERT_TRUE(cast_elements(codes, DType::kF8E8M0, f, DType::kF32, 3).ok());
  EXPECT_EQ(f[0], std::ldexp(1.0f, -127));
  EXPECT_EQ(f[1], 1.0f);
  EXPECT_TRUE(std::isnan(f[2]));
}

}  // namespace
}  // namespace ckpt
