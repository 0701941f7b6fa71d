// Numeric casts between ckpt dtypes (declared in formats/dtype/dtype.h).
//
// Structure: cast_elements() walks the input in blocks of kBlock elements. Hot pairs
// (bf16/f16 <-> f32) first run a branch-free, vectorizable kernel over the block
// (formats/dtype/cast_kernels.h) that also ORs a "special" flag (a result or input with an all-ones
// exponent: Inf, NaN, or overflow). Blocks whose flag is clear are done; flagged blocks, and every
// other pair, go through the exact scalar path (formats/dtype/cast_scalar.h), which applies the policy
// and counts. Bit-level formats: formats/dtype/float_bits.h.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>

#include "formats/base/checked.h"
#include "formats/dtype/cast_kernels.h"
#include "formats/dtype/cast_scalar.h"
#include "formats/dtype/dtype.h"
#include "formats/dtype/float_bits.h"

namespace ckpt {

namespace cd = cast_detail;

namespace {

bool valid_dtype(DType t) { return static_cast<unsigned>(t) < static_cast<unsigned>(kNumDTypes); }

std::string fmt_double(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

constexpr size_t kBlock = 4096;
// Outputs at least this large are written with streaming stores by the ISA kernels (they would
// not stay in cache anyway; this saves the read-for-ownership of the destination).
constexpr uint64_t kStreamBytes = uint64_t{8} << 20;

// Casts n > 0 elements between two different dtypes (buffers checked, not overlapping): block by
// block, the fast kernel (or bf16 <-> f16 through f32) first, the scalar path for flagged blocks.
Status convert(const uint8_t* src, DType from, uint8_t* dst, DType to, size_t n, uint64_t out_bytes,
               const CastOptions& opts, cd::Counters& c, const std::string& pair) {
  const size_t fs = dtype_size(from), ts = dtype_size(to);
  cd::Kernel fast = cd::fast_kernel(from, to);
  // bf16 <-> f16: two fast stages through an f32 block (exact, then one rounding).
  cd::Kernel stage1 = nullptr, stage2 = nullptr;
  if (fast == nullptr && from != to && (from == DType::kBF16 || from == DType::kF16) &&
      (to == DType::kBF16 || to == DType::kF16)) {
    stage1 = cd::fast_kernel(from, DType::kF32);
    stage2 = cd::fast_kernel(DType::kF32, to);
  }
  const cd::BlockFn slow = cd::block_fn(from, to);
  if (slow == nullptr) return Status::Internal(pair + ": no cast routine");
  const bool nt = fast != nullptr && out_bytes >= kStreamBytes;
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
  const uintptr_t d0 = reinterpret_cast<uintptr_t>(dst);
  if (nt && d0 % ts == 0) {  // a head up to the first 32-byte aligned output element
    const size_t head = std::min<size_t>(((32 - d0 % 32) % 32) / ts, n);
    if (head > 0) run(head, false);
  }
  while (i < n) run(std::min(kBlock, n - i), nt);
  if (nt) cd::fence_streaming_stores();  // order the streaming stores before the caller publishes dst
  return Status::Ok();
}

// The error of a cast that met what the options refuse (Ok when it met nothing of the kind).
Status cast_status(const std::string& pair, size_t n, DType to, const cd::Counters& c, const CastOptions& opts) {
  const bool overflow_err = c.overflowed > 0 && opts.overflow == OverflowPolicy::kError;
  if (!overflow_err && c.rejected_nans == 0 && c.inexact == 0 && c.invalid_bool == 0) return Status::Ok();

  std::string msg = pair + " of " + std::to_string(n) + " elements:";
  std::string sep = " ";
  if (overflow_err) {
    msg += sep + std::to_string(c.overflowed) + " out of range (first at index " +
           std::to_string(c.first_overflow) + ", value " + fmt_double(c.first_overflow_value) + ")";
    if (dtype_is_float(to)) msg += ", target max finite " + fmt_double(cd::max_finite_of(to));
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

}  // namespace

// ---------------------------------------------------------------------------------------------
// Public scalar conversions.

float bf16_to_f32(uint16_t h) { return cd::f32_from(static_cast<uint32_t>(h) << 16); }

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t E = (h >> 10) & 0x1Fu, M = h & 0x3FFu;
  if (E == 0x1F) return cd::f32_from(sign | 0x7F800000u | (M << 13));
  if (E == 0) {
    const float v = static_cast<float>(M) * 0x1.0p-24f;  // exact: M < 2^10
    return cd::f32_from(sign | cd::f32_bits(v));
  }
  return cd::f32_from(sign | ((E + 112u) << 23) | (M << 13));
}

uint16_t f32_to_bf16(float f) {
  const uint32_t u = cd::f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) {  // NaN: keep sign and leading payload bits
    uint32_t payload = (u >> 16) & 0x7Fu;
    if (payload == 0) payload = 1;
    return static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7F80u | payload);
  }
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

uint16_t f32_to_f16(float f) {
  const double d = cd::f32_to_f64_exact(f);
  if (std::isnan(d)) return static_cast<uint16_t>(cd::encode_nan(d, cd::kFmtF16));
  cd::Enc enc;
  return static_cast<uint16_t>(cd::encode_narrow(d, cd::kFmtF16, &enc));
}

float f8e4m3_to_f32(uint8_t b) { return static_cast<float>(cd::decode_narrow(b, cd::kFmtE4M3)); }
float f8e5m2_to_f32(uint8_t b) { return f16_to_f32(static_cast<uint16_t>(b << 8)); }

float f8e8m0_to_f32(uint8_t b) {
  return b == 0xFF ? std::numeric_limits<float>::quiet_NaN() : std::ldexp(1.0f, static_cast<int>(b) - 127);
}

uint8_t f32_to_f8e4m3(float f, bool saturate) {
  const double d = cd::f32_to_f64_exact(f);
  if (std::isnan(d)) return static_cast<uint8_t>(cd::encode_nan(d, cd::kFmtE4M3));
  cd::Enc enc;
  uint32_t b = cd::encode_narrow(d, cd::kFmtE4M3, &enc);
  if (enc == cd::Enc::kOverflow && saturate) b = (std::signbit(d) ? 0x80u : 0u) | cd::kFmtE4M3.max_finite();
  return static_cast<uint8_t>(b);
}
uint8_t f32_to_f8e5m2(float f, bool saturate) {
  const double d = cd::f32_to_f64_exact(f);
  if (std::isnan(d)) return static_cast<uint8_t>(cd::encode_nan(d, cd::kFmtE5M2));
  cd::Enc enc;
  uint32_t b = cd::encode_narrow(d, cd::kFmtE5M2, &enc);
  if (enc == cd::Enc::kOverflow && saturate) b = (std::signbit(d) ? 0x80u : 0u) | cd::kFmtE5M2.max_finite();
  return static_cast<uint8_t>(b);
}

// ---------------------------------------------------------------------------------------------

Status cast_elements(const void* src_v, DType from, void* dst_v, DType to, size_t n,
                     const CastOptions& opts, CastStats* stats) {
  if (stats) *stats = CastStats{};
  if (!valid_dtype(from) || !valid_dtype(to))
    return Status::InvalidArgument("cast_elements: invalid dtype value " +
                                   std::to_string(static_cast<int>(valid_dtype(from) ? to : from)));
  const std::string pair = "cast " + std::string(dtype_name(from)) + " -> " + std::string(dtype_name(to));
  if (from != to && (from == DType::kF4 || to == DType::kF4))
    return Status::Error("F4Packed", pair + ": an F4 element is a packed pair of values, so this cast would change the "
                                            "element count; unpack or pack with f4_unpack / f4_pack (formats/dtype/dtype.h)");
  const auto in_bytes = checked_mul(uint64_t{n}, uint64_t{dtype_size(from)});
  const auto out_bytes = checked_mul(uint64_t{n}, uint64_t{dtype_size(to)});
  if (!in_bytes || !out_bytes || n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return Status::InvalidArgument(pair + ": element count " + std::to_string(n) + " overflows the byte size");
  if (n == 0) return Status::Ok();
  if (src_v == nullptr || dst_v == nullptr)
    return Status::InvalidArgument(pair + ": null buffer for " + std::to_string(n) + " elements");
  const auto* src = static_cast<const uint8_t*>(src_v);
  auto* dst = static_cast<uint8_t*>(dst_v);
  cd::Counters c;

  if (from == to) {
    if (src != dst) std::memmove(dst, src, *in_bytes);
    if (dtype_is_float(from) && !opts.allow_nan) cd::count_nans(from, src, n, c);
  } else {
    const uintptr_t s0 = reinterpret_cast<uintptr_t>(src), d0 = reinterpret_cast<uintptr_t>(dst);
    if (s0 < d0 + *out_bytes && d0 < s0 + *in_bytes)
      return Status::InvalidArgument(pair + ": source and destination buffers overlap");
    CKPT_RETURN_IF_ERROR(convert(src, from, dst, to, n, *out_bytes, opts, c, pair));
  }

  if (stats) {
    stats->overflowed = c.overflowed;
    stats->nans = c.nans;
    stats->inexact = c.inexact;
    stats->invalid_bool = c.invalid_bool;
    stats->first_bad = c.first_bad;
  }
  return cast_status(pair, n, to, c, opts);
}

}  // namespace ckpt
