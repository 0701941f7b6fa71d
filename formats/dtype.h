// Element types with their safetensors names, and numeric casts between them.
// Casts between float types round to nearest even, keep NaN (as a quiet NaN) and +-Inf, and treat
// overflow (a finite value that does not fit the target) as an error unless saturation is asked
// for. Integer <-> float casts are exact or an error. Pure functions; thread safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "formats/status.h"

namespace ckpt {

enum class DType : uint8_t {
  kBool, kU8, kI8, kI16, kU16, kI32, kU32, kI64, kU64,
  kF16, kBF16, kF32, kF64, kF8E4M3, kF8E5M2,
};
inline constexpr int kNumDTypes = 15;

// Safetensors spelling: "BOOL", "U8", ..., "F8_E4M3", "F8_E5M2".
std::string_view dtype_name(DType t);
// Exact, case-sensitive match against the safetensors names; also accepts the lower-case CLI
// spellings "bf16", "fp16", "fp32", "fp64" when `cli_aliases` is true.
Result<DType> dtype_from_name(std::string_view name, bool cli_aliases = false);
size_t dtype_size(DType t);
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
};

// Casts `n` elements from `src` (type `from`) to `dst` (type `to`). Buffers must not overlap
// unless from == to. Returns kOverflow naming the count and the first bad index on failure;
// the caller adds file/tensor context.
Status cast_elements(const void* src, DType from, void* dst, DType to, size_t n,
                     const CastOptions& opts = {}, CastStats* stats = nullptr);

// Scalar conversions used by casts, tests and the trainer.
float bf16_to_f32(uint16_t h);
float f16_to_f32(uint16_t h);
// Round to nearest even; NaN -> quiet NaN with the sign kept; overflow -> Inf (callers that care
// check with the *_overflows helpers or use cast_elements).
uint16_t f32_to_bf16(float f);
uint16_t f32_to_f16(float f);
float f8e4m3_to_f32(uint8_t b);
float f8e5m2_to_f32(uint8_t b);

}  // namespace ckpt
