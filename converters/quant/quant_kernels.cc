#include "converters/quant/quant_kernels.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <vector>

namespace ckpt::quant {

namespace {

struct Tables {
  std::array<float, 256> e4m3{}, e5m2{};
  Tables() {
    for (int b = 0; b < 256; ++b) {
      e4m3[b] = f8e4m3_to_f32(static_cast<uint8_t>(b));
      e5m2[b] = f8e5m2_to_f32(static_cast<uint8_t>(b));
    }
  }
};
const Tables& tables() {
  static const Tables t;
  return t;
}

constexpr float kE2M1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// Counts what rounding `v` into `out` (n elements of out_dtype) changed.
void count_rounding(const float* v, int64_t n, DType out_dtype, const uint8_t* out, RoundStats& s) {
  s.elements += static_cast<uint64_t>(n);
  if (out_dtype == DType::kF32) return;
  float back[256];
  for (int64_t i = 0; i < n; i += 256) {
    const int64_t m = std::min<int64_t>(256, n - i);
    if (!cast_elements(out + static_cast<size_t>(i) * dtype_size(out_dtype), out_dtype, back, DType::kF32, static_cast<size_t>(m)).ok()) return;
    for (int64_t k = 0; k < m; ++k) {
      const float x = v[i + k];
      if (back[k] == x || (std::isnan(back[k]) && std::isnan(x))) continue;
      ++s.changed;
      const double err = std::fabs(static_cast<double>(back[k]) - x);
      s.max_abs = std::max(s.max_abs, err);
      if (x != 0) s.max_rel = std::max(s.max_rel, err / std::fabs(static_cast<double>(x)));
    }
  }
}

// f32 row -> out dtype.
Status store_row(const float* v, int64_t n, DType out_dtype, uint8_t* dst, RoundStats* stats) {
  Status st = Status::Ok();
  if (out_dtype == DType::kF32) {
    std::memcpy(dst, v, static_cast<size_t>(n) * 4);
  } else if (out_dtype == DType::kBF16) {
    auto* o = reinterpret_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) o[i] = f32_to_bf16(v[i]);
  } else {
    st = cast_elements(v, DType::kF32, dst, out_dtype, static_cast<size_t>(n));
  }
  if (st.ok() && stats) count_rounding(v, n, out_dtype, dst, *stats);
  return st;
}

}  // namespace

const float* fp8_table(DType t) { return t == DType::kF8E5M2 ? tables().e5m2.data() : tables().e4m3.data(); }

Status dequant_fp8_box(const uint8_t* fp8, DType payload, int64_t rows, int64_t cols, int64_t r0, int64_t c0, int64_t bm,
                       int64_t bn, const float* scales, int64_t scols, DType out_dtype, void* out, RoundStats* stats) {
  const float* lut = fp8_table(payload);
  const size_t os = dtype_size(out_dtype);
  std::vector<float> row(static_cast<size_t>(cols));  // [cols] one output row in f32
  auto* dst = static_cast<uint8_t*>(out);
  const int64_t br0 = r0 / bm, bc0 = c0 / bn;
  for (int64_t r = 0; r < rows; ++r) {
    const float* srow = scales + ((r0 + r) / bm - br0) * scols;
    const uint8_t* in = fp8 + r * cols;
    int64_t c = 0;
    while (c < cols) {  // one run per scale block along the row
      const int64_t blk = (c0 + c) / bn;
      const int64_t end = std::min(cols, (blk + 1) * bn - c0);
      const float s = srow[blk - bc0];
      for (int64_t k = c; k < end; ++k) row[static_cast<size_t>(k)] = lut[in[k]] * s;
      c = end;
    }
    CKPT_RETURN_IF_ERROR(store_row(row.data(), cols, out_dtype, dst + static_cast<size_t>(r * cols) * os, stats));
  }
  return Status::Ok();
}

Status dequant_mxfp4(const uint8_t* packed, const uint8_t* exps, size_t pairs, DType out_dtype, void* out, RoundStats* stats) {
  const size_t os = dtype_size(out_dtype);
  float row[32];  // one block of 32 values
  auto* dst = static_cast<uint8_t*>(out);
  for (size_t b = 0; b * 16 < pairs; ++b) {
    const size_t n = std::min<size_t>(16, pairs - b * 16);
    const int e = static_cast<int>(exps[b]) - 127;
    for (size_t k = 0; k < n; ++k) {
      const uint8_t byte = packed[b * 16 + k];
      row[2 * k] = std::ldexp(kE2M1[byte & 0xF], e);
      row[2 * k + 1] = std::ldexp(kE2M1[byte >> 4], e);
    }
    CKPT_RETURN_IF_ERROR(store_row(row, static_cast<int64_t>(2 * n), out_dtype, dst + b * 32 * os, stats));
  }
  return Status::Ok();
}

Result<float> quantize_fp8_block(const float* x, int64_t rows, int64_t cols, int64_t stride, uint8_t* fp8) {
  float amax = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float v = x[r * stride + c];
      if (!std::isfinite(v))
        return Status::Error("QuantNotFinite", "value " + std::to_string(v) + " at (" + std::to_string(r) + ", " + std::to_string(c) +
                                                   ") of a block cannot be quantized");
      amax = std::max(amax, std::fabs(v));
    }
  // transformers writes `_FP8_MAX / max_abs`: a Python float over a tensor is torch's __rtruediv__,
  // reciprocal(max_abs) * 448, two roundings (not one f32 division).
  const float scale = amax > 0 ? (1.0f / amax) * 448.0f : 1.0f;
  const float inv = 1.0f / scale;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float v = std::min(448.0f, std::max(-448.0f, x[r * stride + c] * scale));
      fp8[r * stride + c] = f32_to_f8e4m3(v);
    }
  return inv;
}

namespace {

// triton_kernels' f32 -> e2m1 bit recipe (its comments: "rounding nearest with tie breaking up").
uint8_t e2m1_of(float q) {
  uint32_t b;
  std::memcpy(&b, &q, 4);
  const uint32_t sign = b & 0x80000000u;
  uint32_t exponents = (b >> 23) & 0xFF, mantissas = b & 0x7FFFFF;
  if (exponents < 127) {  // below 1: the implicit bit moved into the mantissa (denormal 0.5)
    const uint32_t adjusted = 127 - (exponents + 1);
    mantissas = adjusted >= 32 ? 0 : (0x400000u | (mantissas >> 1)) >> adjusted;
  }
  exponents = std::max<uint32_t>(exponents, 126) - 126;
  const uint32_t tmp = std::min<uint32_t>((((exponents << 2) | (mantissas >> 21)) + 1) >> 1, 7);
  return static_cast<uint8_t>((sign >> 28) | tmp);
}

}  // namespace

Result<uint8_t> quantize_mxfp4_block(const float* x, uint8_t* packed) {
  float amax = -1.0f;
  for (int k = 0; k < 32; ++k) {
    if (!std::isfinite(x[k]))
      return Status::Error("QuantNotFinite",
                           "value " + std::to_string(x[k]) + " at " + std::to_string(k) + " of a 32-value block cannot be quantized");
    amax = std::max(amax, std::fabs(x[k]));
  }
  const float dequant = amax / 6.0f;
  uint32_t bits;
  std::memcpy(&bits, &dequant, 4);
  const uint32_t exp_bits = (bits + 0x007FFFFFu) & 0x7F800000u;
  float rounded;
  std::memcpy(&rounded, &exp_bits, 4);
  const float quant_scale = rounded == 0 ? 0.0f : 1.0f / rounded;
  for (int k = 0; k < 16; ++k)
    packed[k] = static_cast<uint8_t>(e2m1_of(x[2 * k] * quant_scale) | (e2m1_of(x[2 * k + 1] * quant_scale) << 4));
  return static_cast<uint8_t>(exp_bits >> 23);
}

}  // namespace ckpt::quant
