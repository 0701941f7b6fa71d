#include "formats/tensor/tiling.h"

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <queue>
#include <set>
#include <vector>

namespace ckpt {

namespace tiling_detail {

using Pair = std::optional<std::pair<size_t, size_t>>;

Pair ordered(size_t x, size_t y) { return std::make_pair(std::min(x, y), std::max(x, y)); }

int64_t end_of(const Box& b, size_t d) { return b.offset[d] + b.extent[d]; }

// Boxes sorted by their offset along `d`: a box meets an earlier one along `d` iff it starts
// before the furthest end so far. Exact when `d` is the only dimension in which boxes differ.
Pair overlap_1d(std::span<const Box> boxes, const std::vector<size_t>& live, size_t d) {
  std::vector<size_t> order = live;
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return boxes[x].offset[d] < boxes[y].offset[d]; });
  size_t reach = order[0];  // the box ending furthest so far
  for (size_t k = 1; k < order.size(); ++k) {
    const size_t i = order[k];
    if (boxes[i].offset[d] < end_of(boxes[reach], d)) return ordered(reach, i);
    if (end_of(boxes[i], d) > end_of(boxes[reach], d)) reach = i;
  }
  return std::nullopt;
}

// Sweep along `p` (boxes by offset); the active boxes (those whose interval along `p` holds the
// sweep position) are kept ordered by their offset along `s`. When the boxes differ in only `p`
// and `s`, active boxes are disjoint along `s` (else an overlap was reported): a new box meets one
// of them iff it meets its neighbour before or after along `s`. Otherwise every active box whose
// offset along `s` lies within the longest active extent before the new box's end is compared.
Pair overlap_sweep(std::span<const Box> boxes, const std::vector<size_t>& live, size_t p, size_t s, bool planar) {
  std::vector<size_t> order = live;
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return boxes[x].offset[p] < boxes[y].offset[p]; });
  using Ends = std::pair<int64_t, size_t>;  // (end along p, box)
  std::priority_queue<Ends, std::vector<Ends>, std::greater<>> ends;
  std::set<std::pair<int64_t, size_t>> active;  // (offset along s, box)
  std::multiset<int64_t> extents;               // the active boxes' extents along s
  for (size_t i : order) {
    const Box& q = boxes[i];
    while (!ends.empty() && ends.top().first <= q.offset[p]) {
      const size_t j = ends.top().second;
      ends.pop();
      active.erase({boxes[j].offset[s], j});
      extents.erase(extents.find(boxes[j].extent[s]));
    }
    if (planar) {
      auto it = active.lower_bound({q.offset[s], 0});
      if (it != active.end() && it->first < end_of(q, s)) return ordered(it->second, i);
      if (it != active.begin() && end_of(boxes[std::prev(it)->second], s) > q.offset[s]) return ordered(std::prev(it)->second, i);
    } else if (!active.empty()) {
      const int64_t from = q.offset[s] - *extents.rbegin();
      for (auto it = active.upper_bound({from, SIZE_MAX}); it != active.end() && it->first < end_of(q, s); ++it)
        if (intersect(boxes[it->second], q)) return ordered(it->second, i);
    }
    active.insert({q.offset[s], i});
    extents.insert(q.extent[s]);
    ends.push({end_of(q, p), i});
  }
  return std::nullopt;
}

// The dimensions in which not every box of `live` has the same interval, most distinct offsets first.
std::vector<size_t> cut_dimensions(std::span<const Box> boxes, const std::vector<size_t>& live) {
  const size_t nd = boxes[live[0]].ndim();
  std::vector<std::pair<size_t, size_t>> cut;  // (distinct offsets, dimension)
  for (size_t d = 0; d < nd; ++d) {
    std::set<std::pair<int64_t, int64_t>> intervals;
    std::set<int64_t> offsets;
    for (size_t i : live) {
      intervals.insert({boxes[i].offset[d], boxes[i].extent[d]});
      offsets.insert(boxes[i].offset[d]);
    }
    if (intervals.size() > 1) cut.push_back({offsets.size(), d});
  }
  std::stable_sort(cut.begin(), cut.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
  std::vector<size_t> dims;
  for (const auto& c : cut) dims.push_back(c.second);
  return dims;
}

using FlatRange = std::pair<std::pair<int64_t, int64_t>, size_t>;  // ((begin, end), piece)

// The flat pieces of one box: disjoint and, with `cover`, tiling [0, n).
std::optional<TilingFault> check_flat_ranges(std::vector<FlatRange>& ranges, int64_t n, bool cover) {
  using Kind = TilingFault::Kind;
  std::sort(ranges.begin(), ranges.end());
  int64_t at = 0;
  size_t last = ranges.front().second;
  for (const auto& [r, piece] : ranges) {
    const auto [b, e] = r;
    if (b == e) continue;  // holds nothing
    if (b < at) return TilingFault{Kind::kFlatOverlap, std::min(last, piece), std::max(last, piece), b, 0, 0, {}};
    if (b > at && cover) return TilingFault{Kind::kFlatGap, piece, 0, at, 0, 0, {}};
    at = e;
    last = piece;
  }
  if (at != n && cover) return TilingFault{Kind::kFlatGap, last, 0, at, 0, 0, {}};
  return std::nullopt;
}

}  // namespace tiling_detail

std::optional<std::pair<size_t, size_t>> find_box_overlap(std::span<const Box> boxes) {
  using namespace tiling_detail;
  std::vector<size_t> live;
  for (size_t i = 0; i < boxes.size(); ++i)
    if (!boxes[i].empty()) live.push_back(i);
  if (live.size() < 2) return std::nullopt;
  const std::vector<size_t> dims = cut_dimensions(boxes, live);
  if (dims.empty()) return ordered(live[0], live[1]);  // the same box twice (or two rank-0 boxes)
  if (dims.size() == 1) return overlap_1d(boxes, live, dims[0]);
  return overlap_sweep(boxes, live, dims[0], dims[1], dims.size() == 2);
}

std::optional<TilingFault> find_tiling_fault(const Shape& shape, std::span<const Region> pieces, const TilingRules& rules) {
  using namespace tiling_detail;
  using Kind = TilingFault::Kind;
  auto total = shape_numel(shape);
  if (!total.ok()) return TilingFault{Kind::kBadShape, 0, 0, 0, 0, 0, total.status().message()};
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Region& r = pieces[i];
    if (r.is_flat() && !rules.flat_ranges) return TilingFault{Kind::kNotABox, i, 0, 0, 0, 0, {}};
    if (Status st = validate_box(r.box, shape); !st.ok()) return TilingFault{Kind::kOutside, i, 0, 0, 0, 0, st.message()};
    if (!flat_range_fits(r)) return TilingFault{Kind::kFlatOutside, i, 0, 0, 0, 0, {}};
  }
  std::map<std::pair<Shape, Shape>, std::vector<FlatRange>> flats;
  for (size_t i = 0; i < pieces.size(); ++i)
    if (pieces[i].is_flat()) flats[{pieces[i].box.offset, pieces[i].box.extent}].push_back({{pieces[i].flat_begin, pieces[i].flat_end}, i});
  for (auto& [box, ranges] : flats)
    if (auto f = check_flat_ranges(ranges, Box{box.first, box.second}.numel(), rules.cover)) return f;
  std::vector<Box> boxes;
  std::vector<size_t> piece_of;
  int64_t covered = 0;  // no overflow: the pieces are inside the tensor, and disjoint when summed
  for (size_t i = 0; i < pieces.size(); ++i)
    for (Box& b : pieces[i].boxes())
      if (!b.empty()) {
        boxes.push_back(std::move(b));
        piece_of.push_back(i);
      }
  if (auto ov = find_box_overlap(boxes)) {
    const size_t x = piece_of[ov->first], y = piece_of[ov->second];
    return TilingFault{Kind::kOverlap, std::min(x, y), std::max(x, y), 0, 0, 0, {}};
  }
  for (const Region& r : pieces) covered += r.numel();
  if (rules.cover && covered != *total) return TilingFault{Kind::kGap, 0, 0, 0, covered, *total, {}};
  return std::nullopt;
}

}  // namespace ckpt
