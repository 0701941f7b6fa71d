// find_tiling_fault / find_box_overlap against a naive reference that counts, element by element,
// how many pieces hold each element of the tensor (tests/naive_region.h naive_indices) and how
// many flat ranges hold each element of their box. Random near-tilings (guillotine partitions of
// small tensors, some boxes cut into flat ranges, then mutated) cover every fault kind; large grids
// check that the sweep is not pairwise (65,536 pieces: a pairwise check makes 2^31 comparisons).
#include "formats/tensor/tiling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "tests/naive_region.h"
#include "tests/test_cases.h"

namespace ckpt {
namespace {

using Kind = TilingFault::Kind;

struct Naive {
  Kind kind;
  bool fault = false;
  size_t piece = 0;  // kNotABox / kOutside / kFlatOutside: the first misplaced piece
  int64_t at = 0;    // flat faults: the first element of the box held by no range or by two
  Box flat_box;      // flat faults: the box
  int64_t covered = 0, total = 0;
};

bool inside(const Box& b, const Shape& s) {
  if (b.offset.size() != s.size() || b.extent.size() != s.size()) return false;
  for (size_t d = 0; d < s.size(); ++d)
    if (b.offset[d] < 0 || b.extent[d] < 0 || static_cast<__int128>(b.offset[d]) + b.extent[d] > s[d]) return false;
  return true;
}

int64_t count(const Shape& s) {
  int64_t n = 1;
  for (int64_t e : s) n *= e;
  return n;
}

// The fault find_tiling_fault must report, by counting elements (shapes are small).
Naive naive(const Shape& shape, const std::vector<Region>& ps, const TilingRules& rules) {
  Naive w;
  for (size_t i = 0; i < ps.size() && !w.fault; ++i) {
    const Region& r = ps[i];
    w.piece = i;
    w.fault = true;
    if (r.is_flat() && !rules.flat_ranges) w.kind = Kind::kNotABox;
    else if (!inside(r.box, shape)) w.kind = Kind::kOutside;
    else if (r.is_flat() && (r.flat_begin < 0 || r.flat_begin > r.flat_end || r.flat_end > count(r.box.extent))) w.kind = Kind::kFlatOutside;
    else w.fault = false;
  }
  if (w.fault) return w;
  std::map<std::pair<Shape, Shape>, std::vector<int>> flat;  // per box with flat pieces: count per element
  for (const Region& r : ps)
    if (r.is_flat()) {
      auto& c = flat[{r.box.offset, r.box.extent}];
      c.resize(static_cast<size_t>(count(r.box.extent)));
      for (int64_t k = r.flat_begin; k < r.flat_end; ++k) ++c[static_cast<size_t>(k)];
    }
  for (const auto& [box, c] : flat)
    for (size_t k = 0; k < c.size(); ++k)
      if (c[k] >= 2 || (c[k] == 0 && rules.cover)) {
        w.fault = true;
        w.kind = c[k] >= 2 ? Kind::kFlatOverlap : Kind::kFlatGap;
        w.at = static_cast<int64_t>(k);
        w.flat_box = Box{box.first, box.second};
        return w;
      }
  std::vector<int> c(static_cast<size_t>(count(shape)));
  for (const Region& r : ps)
    for (int64_t g : testing_ref::naive_indices(shape, r)) ++c[static_cast<size_t>(g)];
  w.total = count(shape);
  for (int x : c) {
    w.covered += x;
    if (x >= 2) w.kind = Kind::kOverlap, w.fault = true;
  }
  if (!w.fault && rules.cover && w.covered != w.total) w.kind = Kind::kGap, w.fault = true;
  return w;
}

bool share(const Shape& shape, const Region& x, const Region& y) {
  auto a = testing_ref::naive_indices(shape, x), b = testing_ref::naive_indices(shape, y);
  std::set<int64_t> sa(a.begin(), a.end());
  return std::any_of(b.begin(), b.end(), [&](int64_t g) { return sa.count(g) > 0; });
}

bool holds(const Region& r, int64_t k) { return r.is_flat() ? r.flat_begin <= k && k < r.flat_end : k < r.box.numel(); }

// Checks `got` against the naive verdict; returns a description of the difference or "".
std::string compare(const Shape& shape, const std::vector<Region>& ps, const TilingRules& rules) {
  const Naive w = naive(shape, ps, rules);
  const auto got = find_tiling_fault(shape, ps, rules);
  if (!w.fault) return got ? "fault " + std::to_string(static_cast<int>(got->kind)) + " where the naive count finds none" : "";
  if (!got) return "no fault where the naive count finds kind " + std::to_string(static_cast<int>(w.kind));
  if (got->kind != w.kind)
    return "kind " + std::to_string(static_cast<int>(got->kind)) + ", naive " + std::to_string(static_cast<int>(w.kind));
  switch (w.kind) {
    case Kind::kNotABox:
    case Kind::kOutside:
    case Kind::kFlatOutside:
      return got->a == w.piece ? "" : "piece " + std::to_string(got->a) + ", naive " + std::to_string(w.piece);
    case Kind::kFlatOverlap:
      if (got->at != w.at || !(got->a < got->b)) return "flat overlap at " + std::to_string(got->at) + ", naive " + std::to_string(w.at);
      for (size_t p : {got->a, got->b})
        if (!ps[p].is_flat() || !(ps[p].box == w.flat_box) || !holds(ps[p], w.at)) return "flat overlap names a piece that does not hold it";
      return "";
    case Kind::kFlatGap:
      if (got->at != w.at) return "flat gap at " + std::to_string(got->at) + ", naive " + std::to_string(w.at);
      return ps[got->a].box == w.flat_box && ps[got->a].is_flat() ? "" : "flat gap names a piece of another box";
    case Kind::kOverlap:
      return got->a < got->b && share(shape, ps[got->a], ps[got->b]) ? "" : "the two pieces named share no element";
    case Kind::kGap:
      return got->covered == w.covered && got->total == w.total ? "" : "covered " + std::to_string(got->covered) + " of " +
                                                                        std::to_string(got->total) + ", naive " + std::to_string(w.covered);
    case Kind::kBadShape:
      break;
  }
  return "unexpected kind";
}

// Cuts `b` by random guillotine cuts into about `n` boxes (a tiling of `b` that is not a grid).
void guillotine(const Box& b, int n, std::mt19937& rng, std::vector<Box>& out) {
  std::vector<size_t> cuttable;
  for (size_t d = 0; d < b.ndim(); ++d)
    if (b.extent[d] > 1) cuttable.push_back(d);
  if (n <= 1 || cuttable.empty()) return out.push_back(b);
  const size_t d = cuttable[rng() % cuttable.size()];
  const int64_t at = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(b.extent[d] - 1));
  Box lo = b, hi = b;
  lo.extent[d] = at;
  hi.offset[d] += at;
  hi.extent[d] -= at;
  guillotine(lo, n / 2, rng, out);
  guillotine(hi, n - n / 2, rng, out);
}

std::vector<Region> near_tiling(const Shape& shape, bool flat, std::mt19937& rng) {
  std::vector<Box> boxes;
  guillotine(Box::whole(shape), 1 + static_cast<int>(rng() % 9), rng, boxes);
  std::vector<Region> ps;
  for (const Box& b : boxes) {
    const int64_t n = b.numel();
    if (flat && n > 1 && rng() % 3 == 0) {  // the box as 2 or 3 flat ranges
      int64_t c1 = static_cast<int64_t>(rng() % static_cast<uint64_t>(n + 1)), c2 = static_cast<int64_t>(rng() % static_cast<uint64_t>(n + 1));
      if (c1 > c2) std::swap(c1, c2);
      for (auto [x, y] : std::initializer_list<std::pair<int64_t, int64_t>>{{0, c1}, {c1, c2}, {c2, n}})
        if (x < y || rng() % 4 == 0) ps.push_back(Region{b, x, y});
    } else {
      ps.push_back(Region{b});
    }
  }
  const int mutations = static_cast<int>(rng() % 3);
  for (int m = 0; m < mutations && !ps.empty(); ++m) {
    Region& r = ps[rng() % ps.size()];
    const size_t d = r.box.ndim() ? rng() % r.box.ndim() : 0;
    const int64_t step = rng() % 2 ? 1 : -1;
    switch (rng() % 8) {
      case 0: if (r.box.ndim()) r.box.offset[d] += step; break;
      case 1: if (r.box.ndim()) r.box.extent[d] += step; break;
      case 2: ps.erase(ps.begin() + static_cast<std::ptrdiff_t>(rng() % ps.size())); break;
      case 3: ps.push_back(ps[rng() % ps.size()]); break;
      case 4: if (r.is_flat()) r.flat_end += step; else r.flat_end = r.box.numel() - (rng() % 2); break;
      case 5: if (r.is_flat()) r.flat_begin += step; break;
      case 6: ps.push_back(Region{Box{Shape(shape.size(), 0), Shape(shape.size(), 0)}}); break;
      default: if (r.box.ndim() && rng() % 4 == 0) r.box.offset.push_back(0), r.box.extent.push_back(1); break;
    }
  }
  std::shuffle(ps.begin(), ps.end(), rng);
  return ps;
}

TEST(Tiling, RandomNearTilingsMatchTheElementCount) {
  std::mt19937 rng(20240611);
  std::map<int, int> seen;  // kind -> cases (-1: no fault)
  const int cases = testing::property_cases(20000, 200000, 2000);
  for (int c = 0; c < cases; ++c) {
    Shape shape(rng() % 4);
    for (auto& e : shape) e = rng() % 9 == 0 ? 0 : 1 + static_cast<int64_t>(rng() % 5);
    const TilingRules rules{.flat_ranges = rng() % 2 == 0, .cover = rng() % 4 != 0};
    const std::vector<Region> ps = near_tiling(shape, rules.flat_ranges, rng);
    const std::string diff = compare(shape, ps, rules);
    std::string text;
    for (const Region& r : ps) text += r.to_string() + "; ";
    ASSERT_EQ(diff, "") << "shape " << shape_to_string(shape) << " flat " << rules.flat_ranges << " cover " << rules.cover << ": " << text;
    const auto f = find_tiling_fault(shape, ps, rules);
    ++seen[f ? static_cast<int>(f->kind) : -1];
  }
  // The generator reached every kind but kBadShape (a shape the callers refuse first).
  for (int k = -1; k <= static_cast<int>(Kind::kGap); ++k)
    if (k != static_cast<int>(Kind::kBadShape)) {
      EXPECT_GE(seen[k], cases / 500) << "kind " << k;
    }
}

TEST(Tiling, HandCases) {
  const Shape s{4, 6};
  auto box = [](Shape o, Shape e) { return Region{Box{std::move(o), std::move(e)}}; };
  EXPECT_FALSE(find_tiling_fault(s, std::vector{box({0, 0}, {4, 3}), box({0, 3}, {4, 3})}));
  auto f = find_tiling_fault(s, std::vector{box({0, 0}, {4, 3}), box({0, 2}, {4, 4})});
  ASSERT_TRUE(f);
  EXPECT_EQ(f->kind, Kind::kOverlap);
  f = find_tiling_fault(s, std::vector{box({0, 0}, {4, 3}), box({0, 3}, {3, 3})});
  ASSERT_TRUE(f);
  EXPECT_EQ(f->kind, Kind::kGap);
  EXPECT_EQ(f->covered, 21);
  EXPECT_EQ(f->total, 24);
  EXPECT_FALSE(find_tiling_fault(s, std::vector{box({0, 0}, {4, 3})}, TilingRules{.cover = false}));
  f = find_tiling_fault(s, std::vector{box({0, INT64_MAX}, {4, 3})});  // offset + extent overflows
  ASSERT_TRUE(f);
  EXPECT_EQ(f->kind, Kind::kOutside);
  f = find_tiling_fault(s, std::vector{Region{Box::whole(s), 0, 24}}, TilingRules{.flat_ranges = false});
  ASSERT_TRUE(f);
  EXPECT_EQ(f->kind, Kind::kNotABox);
  f = find_tiling_fault(s, std::vector{Region{Box::whole(s), 0, 10}, Region{Box::whole(s), 12, 24}}, TilingRules{.flat_ranges = true});
  ASSERT_TRUE(f);
  EXPECT_EQ(f->kind, Kind::kFlatGap);
  EXPECT_EQ(f->at, 10);
  // One rank's flat ranges: a gap is the other ranks' part; an overlap is not.
  EXPECT_FALSE(find_tiling_fault(s, std::vector{Region{Box::whole(s), 0, 10}, Region{Box::whole(s), 12, 24}},
                                 TilingRules{.flat_ranges = true, .cover = false}));
  // A scalar: two pieces holding its one element overlap; one piece holding nothing leaves a gap.
  f = find_tiling_fault(Shape{}, std::vector{box({}, {}), box({}, {})});
  ASSERT_TRUE(f);
  EXPECT_EQ(f->kind, Kind::kOverlap);
  f = find_tiling_fault(Shape{}, std::vector{Region{Box{}, 0, 0}}, TilingRules{.flat_ranges = true, .cover = true});
  ASSERT_TRUE(f);
  EXPECT_EQ(f->kind, Kind::kFlatGap);
  f = find_tiling_fault(Shape{-1, 2}, std::vector<Region>{});
  ASSERT_TRUE(f);
  EXPECT_EQ(f->kind, Kind::kBadShape);
}

// A grid of n x n boxes of `shape` (cut along dimensions `a` and `b`), in a scrambled order.
std::vector<Box> grid(Shape shape, size_t a, size_t b, int64_t n) {
  std::vector<Box> boxes;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      Box x = Box::whole(shape);
      x.offset[a] = i * (shape[a] / n), x.extent[a] = shape[a] / n;
      x.offset[b] = j * (shape[b] / n), x.extent[b] = shape[b] / n;
      boxes.push_back(x);
    }
  std::shuffle(boxes.begin(), boxes.end(), std::mt19937(7));
  return boxes;
}

TEST(Tiling, LargeGridsAreSwept) {
  // 256 x 256 boxes cut along two dimensions of a rank-3 tensor, then one box grown into its neighbour.
#if defined(CKPT_TEST_SANITIZED)
  constexpr int64_t kCuts = 64, kCube = 16;  // a sixteenth of the boxes under ASan (a tenth of the speed)
#else
  constexpr int64_t kCuts = 256, kCube = 40;
#endif
  std::vector<Box> boxes = grid({512, 3, 1024}, 0, 2, kCuts);
  std::vector<Region> regions;
  for (const Box& b : boxes) regions.push_back(Region{b});
  EXPECT_FALSE(find_tiling_fault({512, 3, 1024}, regions));
  EXPECT_FALSE(find_box_overlap(boxes));
  regions[1000].box.extent[2] += 1;
  if (regions[1000].box.offset[2] + regions[1000].box.extent[2] > 1024) regions[1000].box.offset[2] -= 1;
  auto f = find_tiling_fault({512, 3, 1024}, regions);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->kind, Kind::kOverlap);
  EXPECT_TRUE(f->a == 1000 || f->b == 1000);
  EXPECT_TRUE(intersect(regions[f->a].box, regions[f->b].box));
  // Cut along three dimensions (kCube^3 boxes): the general sweep.
  std::vector<Box> cube;
  for (int64_t i = 0; i < kCube; ++i)
    for (int64_t j = 0; j < kCube; ++j)
      for (int64_t k = 0; k < kCube; ++k) cube.push_back(Box{{i, 2 * j, 3 * k}, {1, 2, 3}});
  std::shuffle(cube.begin(), cube.end(), std::mt19937(8));
  EXPECT_FALSE(find_box_overlap(cube));
  cube.push_back(Box{{kCube - 1, 2 * (kCube - 1), 3 * (kCube - 1)}, {1, 1, 1}});  // inside the last box
  auto ov = find_box_overlap(cube);
  ASSERT_TRUE(ov);
  EXPECT_EQ(ov->second, cube.size() - 1);
  EXPECT_TRUE(intersect(cube[ov->first], cube[ov->second]));
}

}  // namespace
}  // namespace ckpt
