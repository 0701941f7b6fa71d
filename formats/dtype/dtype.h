// Element types with their safetensors names, and numeric casts between them.
// Casts between float types round to nearest even, keep NaN (as a quiet NaN) and +-Inf, and treat
// overflow (a finite value that does not fit the target) as an error unless saturation is asked
// for. Integer <-> float casts are exact or an error. Pure functions; thread safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "formats/base/status.h"

namespace ckpt {

enum class DType : uint8_t {
  kBool, kU8, kI8, kI16, kU16, kI32, kU32, kI64, kU64,
  kF16, kBF16, kF32, kF64, kF8E4M3, kF8E5M2,
  kF8E8M0,  // float8_e8m0fnu: a power of two 2^(b-127), b = 0..254; 0xFF is NaN; no sign, zero or Inf
  kF4,      // float4_e2m1fn, TWO per byte: see "F4" below
};
inline constexpr int kNumDTypes = 17;

// F4 (E2M1: +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}, no Inf, no NaN) packs two values per byte, the first in
// the low nibble (safetensors' "F4", torch.float4_e2m1fn_x2, gpt-oss's MXFP4 blocks). Inside ckpt an
// F4 *element* is that byte, a packed pair, as torch.float4_e2m1fn_x2 counts it: an F4 tensor's shape
// counts pairs along its last dimension, dtype_size(kF4) == 1, and every byte, box and region
// computation of the engine stays exact (no box can split a byte). Only the edges see single values:
// the safetensors header (its F4 shapes count values; an odd last dimension is F4OddLastDim there),
// f4_unpack / f4_pack below, and the Python module. cast_elements refuses F4 <-> another dtype
// (F4Packed): a cast would change the element count.

// Safetensors spelling: "BOOL", "U8", ..., "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4".
std::string_view dtype_name(DType t);
// Exact, case-sensitive match against the safetensors names; also accepts the lower-case CLI
// spellings "bf16", "fp16", "fp32", "fp64" when `cli_aliases` is true.
Result<DType> dtype_from_name(std::string_view name, bool cli_aliases = false);
// Bytes per element (kF4: 1, a packed pair).
size_t dtype_size(DType t);
// Values per element: 2 for kF4, 1 for every other dtype.
inline int dtype_values_per_element(DType t) { return t == DType::kF4 ? 2 : 1; }
bool dtype_is_float(DType t);

enum class OverflowPolicy : uint8_t { kError, kSaturate };

struct CastOptions {
  OverflowPolicy overflow = OverflowPolicy::kError;
  // When false, a NaN in the input of a cast to a float type is an error (reported like overflow).
  bool allow_nan = true;
};

// What a cast met: counts are filled even when the cast fails.
struct CastStats {
  uint64_t overflowed = 0;  // finite inputs that did not fit the target (saturated or error)
  uint64_t nans = 0;        // NaN inputs
  int64_t first_bad = -1;   // index of the first overflowed (or rejected NaN) element
  // (added by casts) float -> int/bool: non-integral values; int -> float: integers the target
  // cannot hold exactly. Always an error (CastInexact). Also counted in first_bad.
  uint64_t inexact = 0;
  // BOOL source bytes other than 0 and 1 (error kCorruption, CastInvalidBool; in first_bad).
  uint64_t invalid_bool = 0;
};

// Casts `n` elements from `src` (type `from`) to `dst` (type `to`). Buffers must not overlap
// unless from == to. Returns kOverflow naming the count and the first bad index on failure;
// the caller adds file/tensor context.
//
// Exact rules (formats/dtype/dtype_cast.cc; checked against torch/numpy in tests/python/test_casts*.py):
// - Same type: a byte copy (with allow_nan == false, float NaNs are still counted and rejected).
// - Float -> float: one rounding to nearest even from the exact source value (f64 -> f16 does not
//   go through f32). Subnormals are kept both ways (no flush to zero). A finite value that rounds
//   beyond the target's max finite overflows: error kOverflow "CastOverflow" (message: count,
//   first index and value, max finite), or with kSaturate +-max finite. +-Inf stays +-Inf, except
//   into F8_E4M3 (float8_e4m3fn, no Inf: max 448, NaN = S.1111.111), where Inf is an overflow.
//   NaN stays NaN with its sign: a widening cast embeds the payload exactly; a narrowing cast
//   keeps the leading payload bits (the quiet bit included, so f16 -> f32 -> f16 is the identity
//   on all 65536 patterns) and sets the lowest payload bit if none is left (numpy's f16 rule);
//   F8_E4M3 has one NaN per sign.
//   allow_nan == false turns NaN inputs into an error (kOverflow, "CastNaN").
//   Into F8_E8M0 (positive powers of two): a value m * 2^e (1 <= m < 2) becomes 2^(e+1) when
//   m >= 1.5, else 2^e (torch's and ml_dtypes' rule: round to nearest on the exponent, ties up);
//   below 2^-126 values above 2^-127 become 2^-126, the rest 2^-127; beyond 2^127 (and +Inf)
//   overflows (kSaturate: 2^127); zero and negatives cannot be held: CastInexact (ml_dtypes makes
//   them NaN, torch drops the sign).
// - Float -> integer/BOOL: strict, no rounding: a non-integral value is an error (CastInexact,
//   whatever the policy); NaN is an error (CastNaN); a value out of the target's range (+-Inf
//   included) overflows (error, or with kSaturate clamped to the target's min/max).
// - Integer -> float: exact, or an error: an integer beyond the target's max finite overflows
//   (kSaturate clamps); one within range that the target cannot hold exactly (e.g. 2^24 + 1 into
//   F32) is CastInexact.
// - Integer -> integer: exact, or out of range (overflow; kSaturate clamps to min/max).
// - BOOL holds 0 or 1: as a source, other bytes are an error (kCorruption "CastInvalidBool"); as a
//   target, values other than 0 and 1 are out of range (or inexact, e.g. 0.5).
// On error the content of `dst` is unspecified; `stats` is filled either way.
Status cast_elements(const void* src, DType from, void* dst, DType to, size_t n,
                     const CastOptions& opts = {}, CastStats* stats = nullptr);

// Scalar conversions used by casts, tests and the trainer.
float bf16_to_f32(uint16_t h);
float f16_to_f32(uint16_t h);
// Round to nearest even; NaN -> NaN with the sign and the leading payload bits kept (lowest
// payload bit set if none is left); overflow -> Inf (callers that care use cast_elements).
uint16_t f32_to_bf16(float f);
uint16_t f32_to_f16(float f);
float f8e4m3_to_f32(uint8_t b);
float f8e5m2_to_f32(uint8_t b);
// (added by casts) Round to nearest even; overflow gives NaN (E4M3, which has no Inf) or Inf
// (E5M2), or +-max finite when `saturate`; NaN keeps its sign.
uint8_t f32_to_f8e4m3(float f, bool saturate = false);
uint8_t f32_to_f8e5m2(float f, bool saturate = false);
// F8_E8M0 (float8_e8m0fnu): b == 0xFF is NaN, else 2^(b-127).
float f8e8m0_to_f32(uint8_t b);
// F4 (E2M1) value of the low nibble of `nibble`.
float f4_to_f32(uint8_t nibble);

// F4 <-> other dtypes, one value per output element: unpacks `pairs` bytes of packed F4 into
// 2 * pairs elements of `to` (exact for every float dtype but F8_E8M0, which refuses zero and
// negatives), or packs 2 * pairs elements of `from` into `pairs` bytes (rounding to nearest even;
// beyond +-6 overflows: error, or +-6 with kSaturate, as ml_dtypes does; NaN is always CastNaN:
// F4 has none). Errors as cast_elements'.
Status f4_unpack(const uint8_t* src, size_t pairs, void* dst, DType to, const CastOptions& opts = {},
                 CastStats* stats = nullptr);
Status f4_pack(const void* src, DType from, size_t pairs, uint8_t* dst, const CastOptions& opts = {},
               CastStats* stats = nullptr);

// Testing hook: when true, cast_elements uses only its portable loops (no AVX2/F16C kernels), so
// tests can check both code paths on one machine. Process-wide; thread safe.
void set_cast_portable_only(bool on);

}  // namespace ckpt
