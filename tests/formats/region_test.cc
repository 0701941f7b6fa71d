// Region geometry against naive references: flat-range decomposition is checked by enumerating
// every element index; copy_box against an element-by-element copy.
#include "formats/tensor/region.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>

namespace ckpt {
namespace {

// Row-major linear index of a global coordinate inside `box`.
int64_t lin(const Box& box, const Shape& idx) {
  int64_t r = 0;
  for (size_t d = 0; d < box.ndim(); ++d) r = r * box.extent[d] + (idx[d] - box.offset[d]);
  return r;
}

void for_each_index(const Box& b, const std::function<void(const Shape&)>& f) {
  if (b.numel() == 0) return;
  Shape idx = b.offset;
  for (;;) {
    f(idx);
    size_t d = b.ndim();
    for (;;) {
      if (d == 0) return;
      --d;
      if (++idx[d] < b.offset[d] + b.extent[d]) break;
      idx[d] = b.offset[d];
    }
  }
}

TEST(Region, FlatRangeToBoxesMatchesEnumeration) {
  std::mt19937_64 rng(42);
  for (int trial = 0; trial < 2000; ++trial) {
    size_t nd = 1 + rng() % 4;
    Box box{Shape(nd), Shape(nd)};
    for (size_t d = 0; d < nd; ++d) { box.offset[d] = rng() % 3; box.extent[d] = 1 + rng() % 5; }
    int64_t n = box.numel();
    int64_t b = rng() % (n + 1), e = rng() % (n + 1);
    if (b > e) std::swap(b, e);
    auto boxes = flat_range_to_boxes(box, b, e);
    EXPECT_LE(boxes.size(), 2 * nd - 1 + (b == e ? 0 : 0));
    int64_t next = b;
    for (const auto& bx : boxes) {
      ASSERT_TRUE(box.contains(bx)) << bx.to_string() << " in " << box.to_string();
      for_each_index(bx, [&](const Shape& idx) { EXPECT_EQ(lin(box, idx), next); ++next; });
    }
    EXPECT_EQ(next, e);
  }
}

TEST(Region, IntersectAndValidate) {
  Box a{{0, 2}, {4, 4}}, b{{3, 0}, {5, 3}};
  auto c = intersect(a, b);
  ASSERT_TRUE(c);
  EXPECT_EQ(*c, (Box{{3, 2}, {1, 1}}));
  EXPECT_FALSE(intersect(a, Box{{4, 0}, {1, 10}}));
  EXPECT_TRUE(validate_box(a, {4, 6}).ok());
  EXPECT_EQ(validate_box(a, {4, 5}).code(), "RegionOutOfBounds");
  EXPECT_EQ(validate_box(Box{{0}, {1}}, {4, 5}).code(), "RegionRank");
  EXPECT_EQ(validate_box(Box{{INT64_MAX}, {2}}, {4}).code(), "RegionOutOfBounds");
}

TEST(Region, FlatRangeFits) {
  const Box b{{1, 2}, {3, 4}};  // 12 elements
  EXPECT_TRUE(flat_range_fits(Region{b}));  // rectangular
  EXPECT_TRUE(flat_range_fits(Region{b, 0, 12}));
  EXPECT_TRUE(flat_range_fits(Region{b, 5, 5}));
  EXPECT_TRUE(flat_range_fits(Region{b, 12, 12}));
  EXPECT_FALSE(flat_range_fits(Region{b, 0, 13}));   // past the box's 12 elements
  EXPECT_FALSE(flat_range_fits(Region{b, 13, 13}));
  EXPECT_FALSE(flat_range_fits(Region{b, -1, 3}));
  EXPECT_FALSE(flat_range_fits(Region{b, 4, 3}));    // reversed
  EXPECT_TRUE(flat_range_fits(Region{Box{}, 0, 1}));  // rank 0: one element
  EXPECT_FALSE(flat_range_fits(Region{Box{}, 0, 2}));
  EXPECT_TRUE(flat_range_fits(Region{Box{{0, 0}, {0, 5}}, 0, 0}));  // empty box
  EXPECT_FALSE(flat_range_fits(Region{Box{{0, 0}, {0, 5}}, 0, 1}));
  // Against an enumeration: a range fits iff it is ordered, starts and ends at positions of the
  // box and each of its indices is an element of the box; a fitting range's boxes hold exactly
  // its elements.
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 500; ++trial) {
    const size_t nd = 1 + rng() % 3;
    Box box{Shape(nd), Shape(nd)};
    for (size_t d = 0; d < nd; ++d) { box.offset[d] = rng() % 3; box.extent[d] = rng() % 4; }
    const int64_t n = box.numel();
    // flat_end >= 0: a flat region (flat_end == -1 is the rectangular one, checked above)
    const int64_t fb = static_cast<int64_t>(rng() % (n + 4)) - 2, fe = static_cast<int64_t>(rng() % (n + 3));
    bool inside = fb <= fe;  // every index of [fb, fe) is an element of the box
    for (int64_t k = fb; k < fe; ++k) inside = inside && k >= 0 && k < n;
    inside = inside && fb >= 0 && fe <= n;  // an empty range sits at a position of the box
    ASSERT_EQ(flat_range_fits(Region{box, fb, fe}), inside) << box.to_string() << " " << fb << ".." << fe;
    if (!inside) continue;
    int64_t count = 0;
    for (const Box& x : Region{box, fb, fe}.boxes()) count += box.contains(x) ? x.numel() : -1000;
    EXPECT_EQ(count, fe - fb);
  }
}

TEST(Region, SubtractBoxPartitionsTheRest) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 1000; ++trial) {
    const size_t nd = 1 + rng() % 4;
    Box r{Shape(nd), Shape(nd)}, x{Shape(nd), Shape(nd)};
    for (size_t d = 0; d < nd; ++d) {
      r.offset[d] = rng() % 3;
      r.extent[d] = 1 + rng() % 4;
      const int64_t lo = rng() % r.extent[d], hi = lo + 1 + rng() % (r.extent[d] - lo);
      x.offset[d] = r.offset[d] + lo;
      x.extent[d] = hi - lo;
    }
    std::vector<Box> rest;
    subtract_box(r, x, rest);
    EXPECT_LE(rest.size(), 2 * nd);
    // Every element of r lies in exactly one of x and the returned boxes; nothing outside r.
    std::vector<int> hits(static_cast<size_t>(r.numel()), 0);
    for_each_index(x, [&](const Shape& idx) { ++hits[lin(r, idx)]; });
    for (const Box& b : rest) {
      ASSERT_TRUE(r.contains(b)) << b.to_string() << " outside " << r.to_string();
      for_each_index(b, [&](const Shape& idx) { ++hits[lin(r, idx)]; });
    }
    for (int h : hits) ASSERT_EQ(h, 1) << r.to_string() << " minus " << x.to_string();
  }
}

TEST(Region, CopyBoxMatchesNaive) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    size_t nd = 1 + rng() % 4;
    Shape shape(nd);
    for (auto& s : shape) s = 1 + rng() % 6;
    auto rand_box = [&]() {
      Box bx{Shape(nd), Shape(nd)};
      for (size_t d = 0; d < nd; ++d) {
        int64_t lo = rng() % shape[d], hi = lo + 1 + rng() % (shape[d] - lo);
        bx.offset[d] = lo; bx.extent[d] = hi - lo;
      }
      return bx;
    };
    Box sb = rand_box(), db = rand_box();
    auto reg = intersect(sb, db);
    if (!reg) continue;
    std::vector<int32_t> src(sb.numel()), dst(db.numel(), -1), ref(db.numel(), -1);
    std::iota(src.begin(), src.end(), 100);
    copy_box(src.data(), sb, dst.data(), db, *reg, sizeof(int32_t));
    for_each_index(*reg, [&](const Shape& idx) { ref[lin(db, idx)] = src[lin(sb, idx)]; });
    ASSERT_EQ(dst, ref) << sb.to_string() << " -> " << db.to_string();
  }
}

}  // namespace
}  // namespace ckpt
