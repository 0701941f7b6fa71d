// Tensor-by-tensor comparison of two checkpoints in global view (any layouts, any formats):
// bitwise identity, max abs/rel difference, numpy-allclose tolerance, missing/extra tensors,
// shape and dtype mismatches. Streams each tensor in flat chunks bounded by a memory budget.
// Thread safety: one diff per thread; the sources are used by the calling thread only.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/tensor/tensor_io.h"

namespace ckpt {

struct DiffOptions {
  double atol = 0.0;  // elements a, b are close when |a - b| <= atol + rtol * |b| (numpy.isclose)
  double rtol = 0.0;
  int64_t max_memory = int64_t{256} << 20;  // bytes of the chunk buffers of both sides
  bool ignore_dtype = false;                // a dtype mismatch alone does not make tensors differ
};

enum class TensorDiffKind {
  kIdentical,      // same dtype and shape, every element bitwise equal
  kClose,          // not bitwise equal, every element within tolerance
  kDifferent,      // some element outside tolerance
  kOnlyInA,        // missing from B
  kOnlyInB,        // missing from A
  kShapeMismatch,  // shapes differ (values not compared)
  kDtypeMismatch,  // dtypes differ (values compared and reported; see ignore_dtype)
};
const char* tensor_diff_kind_name(TensorDiffKind k);  // "identical", "close", "different", ...

struct TensorDiff {
  std::string name;
  TensorDiffKind kind = TensorDiffKind::kIdentical;
  DType dtype_a = DType::kF32, dtype_b = DType::kF32;
  Shape shape_a, shape_b;
  int64_t numel = 0;              // elements compared
  int64_t bitwise_differ = 0;     // elements whose bytes differ (same dtype) or values differ
  int64_t not_close = 0;          // elements outside tolerance (NaN vs number, Inf vs other too)
  int64_t nonfinite_differ = 0;   // pairs where a NaN/Inf is not matched by the same on the other side
  double max_abs = 0.0;           // max |a - b| over pairs of finite values
  double max_rel = 0.0;           // max |a - b| / |b| over pairs of finite values with b != 0
  int64_t max_abs_index = -1;     // flat row-major index of the first max_abs element (-1: none)
};

struct DiffReport {
  DiffOptions options;
  std::vector<TensorDiff> tensors;  // sorted by name
  bool equal() const;               // every tensor identical or close (or dtype-only with ignore_dtype)
  nlohmann::json to_json() const;
  std::string to_text() const;      // one line per non-identical tensor, then a summary
};

// Reads box `box` of global tensor `name` as dtype `out` (dense row-major) into `dst`.
using GlobalBoxReader = std::function<Status(const std::string& name, const Box& box, DType out, void* dst)>;

// Compares the tensors listed in `a` and `b`, reading their values through the readers.
Result<DiffReport> diff_tensors(const std::vector<TensorMeta>& a, const GlobalBoxReader& read_a,
                                const std::vector<TensorMeta>& b, const GlobalBoxReader& read_b,
                                const DiffOptions& options);

// Compares two sources in global view (reads go through the executor's read_global_box).
Result<DiffReport> diff_sources(TensorSource& a, TensorSource& b, const DiffOptions& options);


}  // namespace ckpt
