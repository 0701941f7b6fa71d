#include "formats/tensor/region.h"

#include <cstring>

#include "formats/base/checked.h"

namespace ckpt {

std::string shape_to_string(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

Result<int64_t> shape_numel(const Shape& s) {
  auto n = checked_numel(s);
  if (!n) return Status::Error("ShapeOverflow",
                               "shape " + shape_to_string(s) + " has a negative dimension or too many elements");
  return *n;
}

int64_t Box::numel() const {
  int64_t n = 1;
  for (int64_t e : extent) n *= e;
  return n;
}

bool Box::contains(const Box& in) const {
  if (in.ndim() != ndim()) return false;
  for (size_t d = 0; d < ndim(); ++d)
  {
    auto in_end = checked_add(in.offset[d], in.extent[d]);
    auto end = checked_add(offset[d], extent[d]);
    if (!in_end || !end || in.offset[d] < offset[d] || *in_end > *end) return false;
  }
  return true;
}

std::string Box::to_string() const {
  std::string r = "[";
  for (size_t d = 0; d < ndim(); ++d)
  {
    auto end = checked_add(offset[d], extent[d]);
    r += (d ? ", " : "") + std::to_string(offset[d]) + ":" +
         (end ? std::to_string(*end) : "+" + std::to_string(extent[d]));
  }
  return r + "]";
}

Status validate_box(const Box& b, const Shape& shape) {
  if (b.offset.size() != shape.size() || b.extent.size() != shape.size())
    return Status::Error("RegionRank", "region has rank " + std::to_string(b.extent.size()) +
                                                " (offset rank " + std::to_string(b.offset.size()) +
                                                "), tensor shape " + shape_to_string(shape) + " has rank " +
                                                std::to_string(shape.size()));
  for (size_t d = 0; d < shape.size(); ++d) {
    auto end = checked_add(b.offset[d], b.extent[d]);
    if (b.offset[d] < 0 || b.extent[d] < 0 || !end || *end > shape[d])
      return Status::Error("RegionOutOfBounds", "region " + b.to_string() + " lies outside tensor shape " +
                                                         shape_to_string(shape) + " in dimension " + std::to_string(d));
  }
  if (!checked_numel(b.extent)) return Status::Error("ShapeOverflow", "region " + b.to_string() + " overflows");
  return Status::Ok();
}

std::optional<Box> intersect(const Box& a, const Box& b) {
  if (a.ndim() != b.ndim()) return std::nullopt;
  Box r{Shape(a.ndim()), Shape(a.ndim())};
  for (size_t d = 0; d < a.ndim(); ++d) {
    int64_t lo = std::max(a.offset[d], b.offset[d]);
    int64_t hi = std::min(a.offset[d] + a.extent[d], b.offset[d] + b.extent[d]);
    if (hi <= lo) return std::nullopt;
    r.offset[d] = lo;
    r.extent[d] = hi - lo;
  }
  return r;
}

void subtract_box(const Box& r, const Box& x, std::vector<Box>& out) {
  Box rest = r;  // shrinks dimension by dimension to x
  for (size_t d = 0; d < r.ndim(); ++d) {
    const int64_t lo = rest.offset[d], hi = rest.offset[d] + rest.extent[d];
    const int64_t xlo = x.offset[d], xhi = x.offset[d] + x.extent[d];
    if (xlo > lo) {
      Box b = rest;
      b.extent[d] = xlo - lo;
      out.push_back(std::move(b));
    }
    if (xhi < hi) {
      Box b = rest;
      b.offset[d] = xhi;
      b.extent[d] = hi - xhi;
      out.push_back(std::move(b));
    }
    rest.offset[d] = xlo;
    rest.extent[d] = xhi - xlo;
  }
}

namespace {
// Decomposes [b, e) of the sub-array of `box` whose leading indices are fixed by `prefix`
// (prefix.size() == d), appending boxes in order.
void decompose(const Box& box, Shape& prefix, size_t d, int64_t b, int64_t e, std::vector<Box>& out) {
  if (b >= e) return;
  const size_t n = box.ndim();
  auto emit = [&](int64_t lo, int64_t hi) {  // rows [lo, hi) of dim d, full trailing dims
    Box r{Shape(n), Shape(n)};
    for (size_t i = 0; i < d; ++i) { r.offset[i] = box.offset[i] + prefix[i]; r.extent[i] = 1; }
    r.offset[d] = box.offset[d] + lo;
    r.extent[d] = hi - lo;
    for (size_t i = d + 1; i < n; ++i) { r.offset[i] = box.offset[i]; r.extent[i] = box.extent[i]; }
    out.push_back(std::move(r));
  };
  if (d + 1 == n) { emit(b, e); return; }
  int64_t inner = 1;
  for (size_t i = d + 1; i < n; ++i) inner *= box.extent[i];
  if (inner == 0) return;
  int64_t rb = b / inner, re = e / inner;
  if (rb == re) {  // inside one row
    prefix.push_back(rb);
    decompose(box, prefix, d + 1, b - rb * inner, e - rb * inner, out);
    prefix.pop_back();
    return;
  }
  if (b % inner != 0) {
    prefix.push_back(rb);
    decompose(box, prefix, d + 1, b % inner, inner, out);
    prefix.pop_back();
    ++rb;
  }
  if (rb < re) emit(rb, re);
  if (e % inner != 0) {
    prefix.push_back(re);
    decompose(box, prefix, d + 1, 0, e % inner, out);
    prefix.pop_back();
  }
}
}  // namespace

std::optional<int64_t> row_major_run_start(const Box& box, const Box& sub) {
  if (sub.ndim() != box.ndim() || !box.contains(sub) || sub.numel() <= 0) return std::nullopt;
  const size_t n = sub.ndim();
  size_t k = 0;
  while (k < n && sub.extent[k] == 1) ++k;
  for (size_t d = k + 1; d < n; ++d)
    if (sub.extent[d] != box.extent[d]) return std::nullopt;
  int64_t start = 0;  // fits: sub lies inside box, whose numel fits
  for (size_t d = 0; d < n; ++d) start = start * box.extent[d] + (sub.offset[d] - box.offset[d]);
  return start;
}

std::vector<Box> flat_range_to_boxes(const Box& box, int64_t begin, int64_t end) {
  std::vector<Box> out;
  if (begin >= end) return out;
  if (box.ndim() == 0) { out.push_back(box); return out; }
  Shape prefix;
  decompose(box, prefix, 0, begin, end, out);
  return out;
}

std::vector<Box> Region::boxes() const {
  if (!is_flat()) return {box};
  return flat_range_to_boxes(box, flat_begin, flat_end);
}

bool flat_range_fits(const Region& r) {
  if (!r.is_flat()) return true;
  return r.flat_begin >= 0 && r.flat_begin <= r.flat_end && r.flat_end <= r.box.numel();
}

std::string Region::to_string() const {
  std::string s = box.to_string();
  if (is_flat()) s += " flat " + std::to_string(flat_begin) + ".." + std::to_string(flat_end);
  return s;
}

void copy_box(const void* src, const Box& src_box, void* dst, const Box& dst_box, const Box& region,
              size_t elem_size) {
  const size_t n = region.ndim();
  if (region.numel() == 0) return;
  if (n == 0) { std::memcpy(dst, src, elem_size); return; }
  // Row-major strides (in elements) of both buffers.
  std::vector<int64_t> ss(n), ds(n);
  int64_t s = 1, t = 1;
  for (size_t i = n; i-- > 0;) { ss[i] = s; ds[i] = t; s *= src_box.extent[i]; t *= dst_box.extent[i]; }
  // Merge trailing dims that are whole in src, dst and region: one run of `run` elements.
  size_t k = n;  // dims [k, n) form the contiguous run
  int64_t run = 1;
  while (k > 0) {
    size_t d = k - 1;
    run *= region.extent[d];
    --k;
    if (!(region.extent[d] == src_box.extent[d] && region.extent[d] == dst_box.extent[d])) break;
  }
  // Dims [0, k) are iterated; dim k is the first partial (or last merged) dimension.
  int64_t s_off = 0, d_off = 0;
  for (size_t i = 0; i < n; ++i) {
    s_off += (region.offset[i] - src_box.offset[i]) * ss[i];
    d_off += (region.offset[i] - dst_box.offset[i]) * ds[i];
  }
  const auto* sp = static_cast<const unsigned char*>(src);
  auto* dp = static_cast<unsigned char*>(dst);
  const size_t run_bytes = static_cast<size_t>(run) * elem_size;
  if (k == 0) { std::memcpy(dp + d_off * elem_size, sp + s_off * elem_size, run_bytes); return; }
  std::vector<int64_t> idx(k, 0);
  for (;;) {
    std::memcpy(dp + d_off * elem_size, sp + s_off * elem_size, run_bytes);
    size_t d = k;
    while (d > 0) {
      --d;
      if (++idx[d] < region.extent[d]) { s_off += ss[d]; d_off += ds[d]; break; }
      s_off -= (region.extent[d] - 1) * ss[d];
      d_off -= (region.extent[d] - 1) * ds[d];
      idx[d] = 0;
      if (d == 0) return;
    }
  }
}

}  // namespace ckpt
