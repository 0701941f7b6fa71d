// Tests of formats/dtype/dtype.h casts: exhaustive round trips and naive reference rounders, for both
// kernel sets. The error, saturation, NaN, integer and BOOL rules and argument validation are in
// dtype_cast_rules_test.cc. The bit-exact comparison against torch/numpy is
// tests/python/test_casts.py (floats) and test_casts_int.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "formats/dtype/dtype.h"
#include "tests/test_cases.h"

namespace ckpt {
namespace {

// Runs the test body for both kernel sets (ISA-specific and portable) and resets the hook.
class BothPaths : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { set_cast_portable_only(GetParam()); }
  void TearDown() override { set_cast_portable_only(false); }
};
INSTANTIATE_TEST_SUITE_P(Kernels, BothPaths, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "portable" : "isa"; });

uint32_t bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
float from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// Naive f16 decoder (ldexp, no bit tricks shared with the library). NaN -> quiet NaN.
double naive_f16(uint16_t h) {
  const int e = (h >> 10) & 31, m = h & 1023;
  const double s = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 31) return m ? std::nan("") : s * INFINITY;
  if (e == 0) return s * std::ldexp(m, -24);
  return s * std::ldexp(1024 + m, e - 25);
}

// Naive round-to-nearest-even of a finite double into f16 by search over all finite positive
// f16 values; returns 0x7C00 (| sign) beyond the rounding boundary of 65504.
uint16_t naive_to_f16(double x) {
  static const std::vector<double> vals = [] {
    std::vector<double> v;
    for (uint32_t h = 0; h < 0x7C00; ++h) v.push_back(naive_f16(static_cast<uint16_t>(h)));
    return v;
  }();
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  if (a >= 65520.0) return sign | 0x7C00;  // 65520 = 65504 + half an ulp: the tie goes to even (Inf)
  auto it = std::lower_bound(vals.begin(), vals.end(), a);
  size_t hi = static_cast<size_t>(it - vals.begin());
  if (hi == vals.size()) return sign | 0x7BFF;
  if (vals[hi] == a || hi == 0) return sign | static_cast<uint16_t>(hi);
  const size_t lo = hi - 1;
  const double dlo = a - vals[lo], dhi = vals[hi] - a;
  size_t pick = dlo < dhi ? lo : dhi < dlo ? hi : ((lo & 1) ? hi : lo);
  return sign | static_cast<uint16_t>(pick);
}

// Naive f32 -> bf16: the two neighbours by truncation, nearest wins, ties to even.
uint16_t naive_to_bf16(float x) {
  const uint32_t u = bits(x);
  const uint16_t t = static_cast<uint16_t>(u >> 16);
  const double lo = std::fabs(static_cast<double>(from_bits(static_cast<uint32_t>(t) << 16)));
  const double hi = std::fabs(static_cast<double>(from_bits(static_cast<uint32_t>(t + 1) << 16)));
  const double a = std::fabs(static_cast<double>(x));
  if ((t & 0x7FFF) == 0x7F7F && a - lo >= hi - a) return static_cast<uint16_t>(t + 1);  // to Inf
  if (a - lo < hi - a) return t;
  if (a - lo > hi - a) return static_cast<uint16_t>(t + 1);
  return (t & 1) ? static_cast<uint16_t>(t + 1) : t;
}

std::vector<uint32_t> f32_test_patterns() {
  std::vector<uint32_t> v;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200000; ++i) v.push_back(static_cast<uint32_t>(rng()));
  for (uint32_t h = 0; h < 65536; h += 3) {  // every tie class around 16-bit boundaries
    for (uint32_t low : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu, 0x1000u, 0x0FFFu, 0x1001u})
      v.push_back((h << 16) | low);
  }
  for (uint32_t u = 0; u < 3000; ++u) { v.push_back(u); v.push_back(0x80000000u | u); }
  for (float edge : {65504.f, 65520.f, 3.3895314e38f, 2e-14f, 6.1035156e-05f, 5.9604645e-08f}) {
    for (int d = -500; d <= 500; ++d) v.push_back(static_cast<uint32_t>(static_cast<int64_t>(bits(edge)) + d));
  }
  return v;
}

bool is_nan32(uint32_t u) { return (u & 0x7FFFFFFFu) > 0x7F800000u; }

TEST(DTypeScalar, F16RoundTripIdentityAllPatterns) {
  for (uint32_t h = 0; h < 65536; ++h)
    ASSERT_EQ(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h))), h) << std::hex << h;
}

TEST(DTypeScalar, BF16RoundTripIdentityAllPatterns) {
  for (uint32_t h = 0; h < 65536; ++h)
    ASSERT_EQ(f32_to_bf16(bf16_to_f32(static_cast<uint16_t>(h))), h) << std::hex << h;
}

TEST(DTypeScalar, F16DecodeMatchesNaive) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const double ref = naive_f16(static_cast<uint16_t>(h));
    const float got = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(ref)) { ASSERT_TRUE(std::isnan(got)); continue; }
    ASSERT_EQ(static_cast<double>(got), ref) << std::hex << h;
    ASSERT_EQ(std::signbit(got), std::signbit(ref));
  }
}

TEST(DTypeScalar, F8Decode) {
  // A few hand-checked values of float8_e4m3fn and float8_e5m2.
  EXPECT_EQ(f8e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(f8e4m3_to_f32(0xFE), -448.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(f8e4m3_to_f32(0x38), 1.0f);
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(0x7F)));
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(0xFF)));
  EXPECT_EQ(f8e4m3_to_f32(0x78), 256.0f);  // S.1111.000 is a number in e4m3fn
  EXPECT_EQ(f8e5m2_to_f32(0x7B), 57344.0f);
  EXPECT_TRUE(std::isinf(f8e5m2_to_f32(0x7C)));
  EXPECT_TRUE(std::isnan(f8e5m2_to_f32(0x7D)));
  EXPECT_EQ(f8e5m2_to_f32(0x01), std::ldexp(1.0f, -16));
  EXPECT_EQ(f32_to_f8e4m3(464.0f), 0x7E);            // tie -> even (448)
  EXPECT_EQ(f32_to_f8e4m3(465.0f), 0x7F);            // overflow -> NaN (no Inf)
  EXPECT_EQ(f32_to_f8e4m3(465.0f, true), 0x7E);      // saturated
  EXPECT_EQ(f32_to_f8e4m3(-INFINITY, true), 0xFE);
  EXPECT_EQ(f32_to_f8e5m2(61440.0f), 0x7C);          // tie 57344|65536 -> even is Inf
  EXPECT_EQ(f32_to_f8e5m2(61439.0f), 0x7B);
  EXPECT_EQ(f32_to_f8e5m2(1e6f, true), 0x7B);
}

TEST_P(BothPaths, F32ToF16MatchesNaiveRounder) {
  const auto pats = f32_test_patterns();
  std::vector<uint16_t> out(pats.size());
  CastStats st;
  Status s = cast_elements(pats.data(), DType::kF32, out.data(), DType::kF16, pats.size(),
                           {OverflowPolicy::kSaturate, true}, &st);
  ASSERT_TRUE(s.ok()) << s.to_string();
  uint64_t overflows = 0;
  for (size_t i = 0; i < pats.size(); ++i) {
    const uint32_t u = pats[i];
    const float x = from_bits(u);
    if (is_nan32(u)) {
      ASSERT_EQ(out[i] & 0x7C00, 0x7C00);
      ASSERT_NE(out[i] & 0x3FF, 0);
      continue;
    }
    uint16_t ref = std::isinf(x) ? static_cast<uint16_t>(std::signbit(x) ? 0xFC00 : 0x7C00) : naive_to_f16(x);
    if (!std::isinf(x) && (ref & 0x7FFF) == 0x7C00) { ref = (ref & 0x8000) | 0x7BFF; ++overflows; }
    ASSERT_EQ(out[i], ref) << "i=" << i << " x=" << x << std::hex << " bits=" << u;
    ASSERT_EQ(f32_to_f16(x) & 0x7FFF, (ref & 0x7FFF) == 0x7BFF && std::fabs(x) >= 65520.f ? 0x7C00 : ref & 0x7FFF);
  }
  EXPECT_EQ(st.overflowed, overflows);
  EXPECT_GT(overflows, 100u);
}

TEST_P(BothPaths, F32ToBF16MatchesNaiveRounder) {
  const auto pats = f32_test_patterns();
  std::vector<uint16_t> out(pats.size());
  CastStats st;
  Status s = cast_elements(pats.data(), DType::kF32, out.data(), DType::kBF16, pats.size(),
                           {OverflowPolicy::kSaturate, true}, &st);
  ASSERT_TRUE(s.ok()) << s.to_string();
  for (size_t i = 0; i < pats.size(); ++i) {
    const uint32_t u = pats[i];
    const float x = from_bits(u);
    if (is_nan32(u)) {
      // sign and leading payload bits kept, lowest set if none left
      const uint16_t p = (u >> 16) & 0x7F;
      ASSERT_EQ(out[i], ((u >> 16) & 0x8000) | 0x7F80 | (p ? p : 1));
      continue;
    }
    uint16_t ref = std::isinf(x) ? static_cast<uint16_t>(u >> 16) : naive_to_bf16(x);
    if (!std::isinf(x) && (ref & 0x7FFF) == 0x7F80) ref = (ref & 0x8000) | 0x7F7F;
    ASSERT_EQ(out[i], ref) << "i=" << i << std::hex << " bits=" << u;
  }
}

TEST_P(BothPaths, ArrayRoundTripsAllPatterns) {
  std::vector<uint16_t> all(65536), back(65536);
  std::vector<float> wide(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
  for (DType t : {DType::kF16, DType::kBF16}) {
    ASSERT_TRUE(cast_elements(all.data(), t, wide.data(), DType::kF32, all.size()).ok());
    ASSERT_TRUE(cast_elements(wide.data(), DType::kF32, back.data(), t, all.size()).ok());
    EXPECT_EQ(back, all) << dtype_name(t);
    for (uint32_t h = 0; h < 65536; ++h) {
      const float s = t == DType::kF16 ? f16_to_f32(static_cast<uint16_t>(h)) : bf16_to_f32(static_cast<uint16_t>(h));
      ASSERT_EQ(bits(wide[h]), bits(s)) << std::hex << h;  // array path == scalar path
    }
  }
}

TEST_P(BothPaths, BF16AndF16AllPatternsBothWays) {
  // bf16 <-> f16 (two fast stages through f32) equals the exact scalar composition: bf16 and f16
  // are exact in f32, so one rounding; overflow saturated.
  std::vector<uint16_t> all(65536), out(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
  CastStats st;
  ASSERT_TRUE(cast_elements(all.data(), DType::kBF16, out.data(), DType::kF16, all.size(),
                            {OverflowPolicy::kSaturate, true}, &st).ok());
  uint64_t over = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const float x = bf16_to_f32(static_cast<uint16_t>(h));
    uint16_t ref = f32_to_f16(x);
    if (!std::isinf(x) && !std::isnan(x) && (ref & 0x7FFF) == 0x7C00) { ref = (ref & 0x8000) | 0x7BFF; ++over; }
    ASSERT_EQ(out[h], ref) << std::hex << h;
  }
  EXPECT_EQ(st.overflowed, over);
  ASSERT_TRUE(cast_elements(all.data(), DType::kF16, out.data(), DType::kBF16, all.size()).ok());
  for (uint32_t h = 0; h < 65536; ++h)
    ASSERT_EQ(out[h], f32_to_bf16(f16_to_f32(static_cast<uint16_t>(h)))) << std::hex << h;
}

TEST_P(BothPaths, UnalignedBuffersAndOddLengths) {
  std::vector<uint8_t> src(4 * 1001 + 1), dst(2 * 1001 + 1);
  std::mt19937 rng(3);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  for (size_t n : {0u, 1u, 7u, 8u, 9u, 1000u}) {
    CastStats st;
    (void)cast_elements(src.data() + 1, DType::kF32, dst.data() + 1, DType::kF16, n,
                        {OverflowPolicy::kSaturate, true}, &st);
    for (size_t i = 0; i < n; ++i) {
      float x;
      std::memcpy(&x, src.data() + 1 + 4 * i, 4);
      uint16_t h;
      std::memcpy(&h, dst.data() + 1 + 2 * i, 2);
      if (std::isnan(x)) { ASSERT_TRUE(std::isnan(f16_to_f32(h))); continue; }
      uint16_t ref = f32_to_f16(x);
      if (!std::isinf(x) && (ref & 0x7FFF) == 0x7C00) ref = (ref & 0x8000) | 0x7BFF;
      ASSERT_EQ(h, ref) << "n=" << n << " i=" << i;
    }
  }
}

// Outputs of 8 MiB and more take the streaming-store path; check it against the scalar
// conversions (themselves checked against naive rounders above and torch/numpy in Python), with
// specials sprinkled in and destinations at every alignment: 32-byte aligned (+0), element
// aligned (head peeled, +2) and unaligned (+1: no streaming).
TEST_P(BothPaths, LargeArraysStreamingPath) {
  const size_t n = (size_t{9} << 20) / 2 + 123;  // > 8 MiB of 16-bit output
  std::vector<float> src(n);
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 3.f);
  for (auto& x : src) x = nd(rng);
  src[17] = NAN;
  src[n / 2] = 1e6f;  // overflows f16 only
  src[n - 5] = INFINITY;
  std::vector<uint8_t> buf(4 * n + 64);
  uint8_t* base = buf.data() + (32 - reinterpret_cast<uintptr_t>(buf.data()) % 32) % 32;
  // Under ASan (a tenth of the speed) the element-aligned destination only: head peeled, then streamed.
#if defined(CKPT_TEST_SANITIZED)
  for (size_t off : {2u}) {
#else
  for (size_t off : {0u, 1u, 2u}) {
#endif
    for (DType t : {DType::kBF16, DType::kF16}) {
      CastStats st;
      Status s = cast_elements(src.data(), DType::kF32, base + off, t, n, {OverflowPolicy::kSaturate, true}, &st);
      ASSERT_TRUE(s.ok()) << s.to_string();
      EXPECT_EQ(st.nans, 1u);
      EXPECT_EQ(st.overflowed, t == DType::kF16 ? 1u : 0u);
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, base + off + 2 * i, 2);
        uint16_t ref = t == DType::kBF16 ? f32_to_bf16(src[i]) : f32_to_f16(src[i]);
        if (i == n / 2 && t == DType::kF16) ref = 0x7BFF;
        ASSERT_EQ(h, ref) << "off=" << off << " i=" << i << " " << dtype_name(t);
      }
      // and back to f32 (16-bit source, > 8 MiB of f32 output)
      std::vector<uint8_t> wide(4 * n + 64);
      uint8_t* wb = wide.data() + (32 - reinterpret_cast<uintptr_t>(wide.data()) % 32) % 32 + off;
      ASSERT_TRUE(cast_elements(base + off, t, wb, DType::kF32, n).ok());
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, base + off + 2 * i, 2);
        float f;
        std::memcpy(&f, wb + 4 * i, 4);
        ASSERT_EQ(bits(f), bits(t == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h))) << "off=" << off << " i=" << i;
      }
    }
  }
}

TEST_P(BothPaths, OverflowIsAnErrorWithCountAndFirstIndex) {
  // Blocks are 4096 elements: put bad values in the second block too.
  std::vector<float> x(10000, 1.0f);
  x[5000] = 70000.0f;   // > 65504 after rounding
  x[5001] = 65519.0f;   // rounds to 65504: fine
  x[9000] = -1e10f;
  x[9001] = INFINITY;   // Inf stays Inf, not an overflow
  std::vector<uint16_t> out(x.size());
  CastStats st;
  Status s = cast_elements(x.data(), DType::kF32, out.data(), DType::kF16, x.size(), {}, &st);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.kind(), ErrorKind::kOverflow);
  EXPECT_EQ(s.code(), "CastOverflow");
  EXPECT_NE(s.message().find("2 out of range"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("index 5000"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("65504"), std::string::npos) << s.message();
  EXPECT_EQ(st.overflowed, 2u);
  EXPECT_EQ(st.first_bad, 5000);
  // saturate: clamps, keeps sign, Inf stays Inf
  s = cast_elements(x.data(), DType::kF32, out.data(), DType::kF16, x.size(), {OverflowPolicy::kSaturate, true}, &st);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(st.overflowed, 2u);
  EXPECT_EQ(out[5000], 0x7BFF);
  EXPECT_EQ(out[5001], 0x7BFF);
  EXPECT_EQ(out[9000], 0xFBFF);
  EXPECT_EQ(out[9001], 0x7C00);
  EXPECT_EQ(out[0], 0x3C00);
}

TEST(DTypeCast, BF16ToF16OverflowAndSubnormals) {
  std::vector<uint16_t> in = {f32_to_bf16(65280.f), f32_to_bf16(65536.f), f32_to_bf16(1e-7f),
                              f32_to_bf16(1e-9f)};
  std::vector<uint16_t> out(in.size());
  CastStats st;
  Status s = cast_elements(in.data(), DType::kBF16, out.data(), DType::kF16, in.size(), {}, &st);
  EXPECT_EQ(s.code(), "CastOverflow");
  EXPECT_EQ(st.first_bad, 1);
  EXPECT_EQ(out[0], naive_to_f16(65280.0));
  EXPECT_EQ(out[0], 0x7BF8);
  // 1e-7 as bf16 = 1.0011920928955078e-07 -> nearest f16 subnormal (multiple of 2^-24)
  EXPECT_EQ(out[2], naive_to_f16(static_cast<double>(bf16_to_f32(in[2]))));
  EXPECT_EQ(out[2], 2);
  EXPECT_EQ(out[3], 0);
}

}  // namespace
}  // namespace ckpt
