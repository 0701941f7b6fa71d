// The exact scalar path of the casts (formats/dtype/dtype_cast.cc): per (from, to) dtype pair a
// routine that casts one block element by element, applies the overflow / NaN policy and counts
// what it met. Float -> float decodes the source exactly into a double (every value of every
// float dtype is a double) and rounds once into the target, so there is no double rounding.
// The rules are those of cast_elements (formats/dtype/dtype.h). Internal to formats/; thread safe.
#pragma once

#include <cstddef>
#include <cstdint>

#include "formats/dtype/dtype.h"

namespace ckpt::cast_detail {

// What the scalar path met, per reason; the first index of each reason.
struct Counters {
  uint64_t overflowed = 0, nans = 0, rejected_nans = 0, inexact = 0, invalid_bool = 0;
  int64_t first_overflow = -1, first_nan = -1, first_inexact = -1, first_invalid = -1, first_bad = -1;
  double first_overflow_value = 0, first_inexact_value = 0;
  int first_invalid_byte = 0;
};

// Casts `n` elements of one block from `src` to `dst`; `base` is the global index of the first
// (for the first-bad indices in `c`).
using BlockFn = void (*)(const uint8_t*, uint8_t*, size_t, int64_t, const CastOptions&, Counters&);

// The scalar routine of a pair; nullptr when a dtype value is invalid.
BlockFn block_fn(DType from, DType to);

// Counts the NaNs of `n` elements of float dtype `t` as rejected (a same-type copy with
// allow_nan == false); other dtypes count nothing.
void count_nans(DType t, const uint8_t* src, size_t n, Counters& c);

// Largest finite value of a float dtype as a double; 0 for other dtypes.
double max_finite_of(DType t);

}  // namespace ckpt::cast_detail
