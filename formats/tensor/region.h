// Boxes and regions of global tensors: the one geometric idea of ckpt.
// A Box is a hyper-rectangle (offset + extent per dimension) of a tensor's global index space.
// A Region is a Box, or a flat row-major element range [flat_begin, flat_end) of a Box (ZeRO-style
// optimizer shards). A flat range decomposes into at most 2*ndim-1 boxes, each of whose elements
// are contiguous in the range's order, so planners only ever intersect boxes.
// Pure values and functions; thread safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "formats/base/status.h"

namespace ckpt {

using Shape = std::vector<int64_t>;

std::string shape_to_string(const Shape& s);  // "[4, 5]"
// Number of elements, checked (negative dims or overflow -> error naming the shape).
Result<int64_t> shape_numel(const Shape& s);

struct Box {
  Shape offset;
  Shape extent;

  static Box whole(const Shape& shape) { return Box{Shape(shape.size(), 0), shape}; }
  size_t ndim() const { return extent.size(); }
  int64_t numel() const;  // assumes a validated box (no overflow)
  bool empty() const { return numel() == 0; }
  bool contains(const Box& inner) const;
  bool operator==(const Box& o) const = default;
  std::string to_string() const;  // "[0:4, 2:5]"
};

// Checks that `b` has the same rank as `shape`, non-negative offsets and extents, and lies inside
// `shape` without overflow.
Status validate_box(const Box& b, const Shape& shape);

// Intersection of two boxes of the same rank; nullopt when it is empty.
std::optional<Box> intersect(const Box& a, const Box& b);

// Appends r \ x to `out`: at most 2*ndim disjoint boxes whose union with x is r.
// Requires x to lie inside r (same rank).
void subtract_box(const Box& r, const Box& x, std::vector<Box>& out);

// The flat row-major range [begin, end) of `box`'s elements as at most 2*ndim-1 boxes, in order.
// Each returned box's elements, in row-major order, are one contiguous run of the range.
// Requires 0 <= begin <= end <= box.numel(). Rank-0 boxes give one box when the range is [0, 1).
std::vector<Box> flat_range_to_boxes(const Box& box, int64_t begin, int64_t end);

// When the elements of `sub` are one contiguous run of `box`'s row-major storage (every dimension
// after the first one longer than 1 taken whole): the index of sub's first element in `box`.
// nullopt when they are not, or `sub` is empty, of another rank or not inside `box`.
std::optional<int64_t> row_major_run_start(const Box& box, const Box& sub);

struct Region {
  Box box;
  int64_t flat_begin = 0;
  int64_t flat_end = -1;  // -1: the whole box (rectangular region)

  bool is_flat() const { return flat_end >= 0; }
  int64_t numel() const { return is_flat() ? flat_end - flat_begin : box.numel(); }
  // The region as boxes (the box itself when rectangular), in storage order.
  std::vector<Box> boxes() const;
  bool operator==(const Region& o) const = default;
  std::string to_string() const;  // "[0:4, 2:5]" or "[0:4, 2:5] flat 3..17"
};

// The one check that a flat range lies inside its box: true when `r` is rectangular
// (!is_flat()) or 0 <= flat_begin <= flat_end <= box.numel(). `r.box` must be valid
// (validate_box), so that its numel does not overflow. Callers report their own error.
bool flat_range_fits(const Region& r);

// Copies the elements of `region` from `src`, a dense row-major buffer holding exactly the box
// `src_box`, into `dst`, a dense row-major buffer holding exactly `dst_box`. `region` must lie in
// both boxes (global coordinates). Contiguous trailing dimensions are merged into single memcpys.
void copy_box(const void* src, const Box& src_box, void* dst, const Box& dst_box,
              const Box& region, size_t elem_size);

}  // namespace ckpt
