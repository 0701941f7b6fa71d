// Region geometry against naive references: flat-range decomposition is checked by enumerating
// every element index; copy_box against an element-by-element copy.
#include "formats/region.h"

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
