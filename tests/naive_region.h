// Test-only reference: the bytes of a region (storage order) taken element by element from a
// global row-major buffer. Deliberately naive (no boxes, no memcpy runs) so that it can judge the
// executor's and the planner's copies independently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "formats/tensor/region.h"

namespace ckpt::testing_ref {

inline std::vector<uint8_t> naive_extract(const std::vector<uint8_t>& global, const Shape& shape, const Region& region,
                                          size_t es) {
  const Box& b = region.box;
  int64_t bn = 1;
  for (int64_t e : b.extent) bn *= e;
  const int64_t fb = region.is_flat() ? region.flat_begin : 0, fe = region.is_flat() ? region.flat_end : bn;
  std::vector<uint8_t> out;
  out.reserve(static_cast<size_t>(fe - fb) * es);
  std::vector<int64_t> idx(b.ndim());
  for (int64_t k = fb; k < fe; ++k) {
    int64_t rem = k;  // unravel k over the box extent
    for (size_t d = b.ndim(); d-- > 0;) {
      idx[d] = rem % b.extent[d];
      rem /= b.extent[d];
    }
    int64_t g = 0;
    for (size_t d = 0; d < b.ndim(); ++d) g = g * shape[d] + (b.offset[d] + idx[d]);
    out.insert(out.end(), global.begin() + g * static_cast<int64_t>(es), global.begin() + (g + 1) * static_cast<int64_t>(es));
  }
  return out;
}

// Global flat indices of a region, element by element (no boxes, no runs).
inline std::vector<int64_t> naive_indices(const Shape& shape, const Region& r) {
  const Box& b = r.box;
  int64_t bn = 1;
  for (int64_t e : b.extent) bn *= e;
  const int64_t fb = r.is_flat() ? r.flat_begin : 0, fe = r.is_flat() ? r.flat_end : bn;
  std::vector<int64_t> out, idx(b.ndim());
  for (int64_t k = fb; k < fe; ++k) {
    int64_t rem = k;
    for (size_t d = b.ndim(); d-- > 0;) {
      idx[d] = rem % b.extent[d];
      rem /= b.extent[d];
    }
    int64_t g = 0;
    for (size_t d = 0; d < b.ndim(); ++d) g = g * shape[d] + (b.offset[d] + idx[d]);
    out.push_back(g);
  }
  return out;
}

}  // namespace ckpt::testing_ref
