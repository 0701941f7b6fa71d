// F4 (E2M1, two values per byte, the first in the low nibble) to and from other dtypes, one value
// per element of the other dtype (declared in formats/dtype/dtype.h). Values: +-{0, 0.5, 1, 1.5, 2,
// 3, 4, 6}; no Inf, no NaN. Unpacking decodes into f32 (exact) and casts that with cast_elements;
// packing casts into f64 (exact for every float dtype) and rounds each value once.
#include <cmath>
#include <cstring>
#include <string>

#include "formats/base/checked.h"
#include "formats/dtype/dtype.h"

namespace ckpt {

namespace {

constexpr float kF4Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                 -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
constexpr size_t kBlock = 2048;  // pairs per step

// Rounds |a| (finite, >= 0) to nearest even on the E2M1 grid; returns the 3-bit magnitude code, or
// 8 when the value rounds beyond 6 (overflow). On each binade the grid is evenly spaced and the
// parity of the grid index is the parity of the code, so nearbyint's ties-to-even is the format's.
uint8_t f4_round_mag(double a) {
  const double step = a < 2 ? 0.5 : (a < 4 ? 1.0 : 2.0);
  const double q = std::nearbyint(a / step);  // exact division by a power of two
  const double v = q * step;
  if (v > 6) return 8;
  if (v < 2) return static_cast<uint8_t>(v * 2);  // 0, 0.5, 1, 1.5 -> 0..3; 2 handled below
  if (v < 4) return static_cast<uint8_t>(v + 2);  // 2, 3 -> 4, 5
  return v == 4 ? 6 : 7;
}

std::string pair_name(DType a, DType b) { return "cast " + std::string(dtype_name(a)) + " -> " + std::string(dtype_name(b)); }

Status check_sizes(const std::string& what, size_t pairs, DType other) {
  if (!checked_mul(uint64_t{pairs}, uint64_t{2} * dtype_size(other)) || pairs > (uint64_t{1} << 61))
    return Status::InvalidArgument(what + ": element count " + std::to_string(pairs) + " pairs overflows the byte size");
  if (other == DType::kF4) return Status::InvalidArgument(what + ": F4 on both sides is a byte copy");
  return Status::Ok();
}

void add_stats(CastStats* total, const CastStats& s, int64_t base) {
  if (total == nullptr) return;
  total->overflowed += s.overflowed;
  total->nans += s.nans;
  total->inexact += s.inexact;
  total->invalid_bool += s.invalid_bool;
  if (s.first_bad >= 0 && total->first_bad < 0) total->first_bad = base + s.first_bad;
}

}  // namespace

float f4_to_f32(uint8_t nibble) { return kF4Values[nibble & 0xF]; }

Status f4_unpack(const uint8_t* src, size_t pairs, void* dst, DType to, const CastOptions& opts, CastStats* stats) {
  if (stats) *stats = CastStats{};
  const std::string what = pair_name(DType::kF4, to);
  CKPT_RETURN_IF_ERROR(check_sizes(what, pairs, to));
  float tmp[2 * kBlock];  // [2 * kBlock] decoded values
  auto* out = static_cast<uint8_t*>(dst);
  const size_t ts = dtype_size(to);
  for (size_t i = 0; i < pairs; i += kBlock) {
    const size_t m = std::min(kBlock, pairs - i);
    for (size_t k = 0; k < m; ++k) {
      tmp[2 * k] = kF4Values[src[i + k] & 0xF];
      tmp[2 * k + 1] = kF4Values[src[i + k] >> 4];
    }
    CastStats s;
    Status st = cast_elements(tmp, DType::kF32, out + 2 * i * ts, to, 2 * m, opts, &s);
    add_stats(stats, s, static_cast<int64_t>(2 * i));
    if (!st.ok()) return Status::Error(st.code(), what + " (values from " + std::to_string(2 * i) + "): " + st.message());
  }
  return Status::Ok();
}

Status f4_pack(const void* src, DType from, size_t pairs, uint8_t* dst, const CastOptions& opts, CastStats* stats) {
  if (stats) *stats = CastStats{};
  const std::string what = pair_name(from, DType::kF4);
  CKPT_RETURN_IF_ERROR(check_sizes(what, pairs, from));
  double tmp[2 * kBlock];  // [2 * kBlock] exact values
  const auto* in = static_cast<const uint8_t*>(src);
  const size_t fs = dtype_size(from);
  CastStats total;
  int64_t first_over = -1, first_nan = -1;
  for (size_t i = 0; i < pairs; i += kBlock) {
    const size_t m = std::min(kBlock, pairs - i);
    CastStats s;
    Status st = cast_elements(in + 2 * i * fs, from, tmp, DType::kF64, 2 * m, CastOptions{}, &s);
    if (!st.ok()) return Status::Error(st.code(), what + " (values from " + std::to_string(2 * i) + "): " + st.message());
    for (size_t k = 0; k < 2 * m; ++k) {
      const double v = tmp[k];
      const int64_t idx = static_cast<int64_t>(2 * i + k);
      uint8_t code = 0;
      if (std::isnan(v)) {
        ++total.nans;
        if (first_nan < 0) first_nan = idx;
      } else {
        code = std::isinf(v) ? 8 : f4_round_mag(std::fabs(v));
        if (code == 8) {
          ++total.overflowed;
          if (first_over < 0) first_over = idx;
          code = 7;  // +-6 (kept only with kSaturate)
        }
        if (std::signbit(v)) code |= 8;
      }
      uint8_t& b = dst[i + k / 2];
      b = (k % 2 == 0) ? code : static_cast<uint8_t>(b | (code << 4));
    }
  }
  total.first_bad = first_nan >= 0 && (first_over < 0 || first_nan < first_over) ? first_nan : first_over;
  if (stats) *stats = total;
  if (total.nans > 0)
    return Status::Error("CastNaN", what + " of " + std::to_string(2 * pairs) + " values: " + std::to_string(total.nans) +
                                        " NaN (first at index " + std::to_string(first_nan) + "), which F4 cannot hold");
  if (total.overflowed > 0 && opts.overflow == OverflowPolicy::kError)
    return Status::Error("CastOverflow", what + " of " + std::to_string(2 * pairs) + " values: " + std::to_string(total.overflowed) +
                                             " out of range (first at index " + std::to_string(first_over) +
                                             "), target max finite 6 (saturation clamps out-of-range values to the target's limits)");
  return Status::Ok();
}

}  // namespace ckpt
