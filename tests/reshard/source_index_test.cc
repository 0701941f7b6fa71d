// copy_ops (reshard/source_index.h) on random source piece sets (grid boxes, some split into
// flat ranges) and random ranges of random target pieces: checked element by element against
// coordinates computed here by unravelling flat indices (no boxes, no flat_range_to_boxes).
#include "reshard/source_index.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

#include "tests/reshard/executor_world.h"

namespace ckpt {
namespace {

using namespace exec_test;

// Global coordinates of flat index k (row-major) of `box`.
Shape unravel(const Box& box, int64_t k) {
  Shape idx(box.ndim());
  for (size_t d = box.ndim(); d-- > 0;) {
    idx[d] = box.offset[d] + k % box.extent[d];
    k /= box.extent[d];
  }
  return idx;
}

// Flat index of global coordinates `g` in `box`, or -1 when outside it.
int64_t ravel(const Box& box, const Shape& g) {
  int64_t k = 0;
  for (size_t d = 0; d < box.ndim(); ++d) {
    if (g[d] < box.offset[d] || g[d] >= box.offset[d] + box.extent[d]) return -1;
    k = k * box.extent[d] + (g[d] - box.offset[d]);
  }
  return k;
}

TEST(CopyOps, RangesOfRandomTargetsMatchUnravelledElements) {
  std::mt19937 rng(77);
  for (int iter = 0; iter < 300; ++iter) {
    Shape shape;
    const int nd = 1 + static_cast<int>(rng() % 3);
    for (int d = 0; d < nd; ++d) shape.push_back(1 + static_cast<int64_t>(rng() % 7));
    const TensorMeta t{"t", DType::kF32, shape};
    const std::vector<Piece> src = random_pieces(t, rng, DType::kF32);
    auto index = SourceIndex::build({t}, src);
    ASSERT_TRUE(index.ok()) << index.status().to_string();
    for (const Piece& target : random_pieces(t, rng, DType::kF32)) {
      const int64_t n = target.region.numel();
      int64_t a = static_cast<int64_t>(rng() % (n + 1)), b = static_cast<int64_t>(rng() % (n + 1));
      if (a > b) std::swap(a, b);
      auto c = copy_ops(*index, target, a, b);
      ASSERT_TRUE(c.ok()) << c.status().to_string();
      ASSERT_EQ(c->boxes.size(), c->box_off.size());
      // Element j of the range (j = 0 .. b-a) lies at these global coordinates:
      const int64_t base = target.region.is_flat() ? target.region.flat_begin : 0;
      std::map<Shape, int64_t> want;  // coordinates -> position in the range
      for (int64_t j = 0; j < b - a; ++j) want[unravel(target.region.box, base + a + j)] = j;
      // The boxes, enumerated row-major one after the other, are the range in order.
      int64_t pos = 0;
      for (size_t k = 0; k < c->boxes.size(); ++k) {
        ASSERT_EQ(c->box_off[k], pos);
        for (int64_t e = 0; e < c->boxes[k].numel(); ++e, ++pos) {
          auto it = want.find(unravel(c->boxes[k], e));
          ASSERT_TRUE(it != want.end());
          ASSERT_EQ(it->second, pos);
        }
      }
      ASSERT_EQ(pos, b - a);
      // The parts hold every element once, each inside its box and inside its source piece.
      std::map<Shape, int> seen;
      for (const CopyOps::Op& op : c->ops) {
        ASSERT_LT(op.box, c->boxes.size());
        const Piece& sp = src[op.part.piece];
        for (int64_t e = 0; e < op.part.box.numel(); ++e) {
          const Shape g = unravel(op.part.box, e);
          ASSERT_GE(ravel(c->boxes[op.box], g), 0);
          const int64_t f = ravel(sp.region.box, g);
          ASSERT_GE(f, 0);
          if (sp.region.is_flat()) {
            ASSERT_TRUE(f >= sp.region.flat_begin && f < sp.region.flat_end);
          }
          ++seen[g];
        }
      }
      ASSERT_EQ(seen.size(), want.size());
      for (const auto& [g, count] : seen) ASSERT_EQ(count, 1);
    }
  }
}

TEST(CopyOps, UncoveredRangeNamesTheMissingBox) {
  const TensorMeta t{"w", DType::kF32, {4, 4}};
  auto index = SourceIndex::build({t}, {{"w", Region{Box{{0, 0}, {2, 4}}}, DType::kF32}});
  ASSERT_TRUE(index.ok());
  const Piece target{"w", Region{Box::whole({4, 4})}, DType::kF32};
  EXPECT_TRUE(copy_ops(*index, target, 0, 8).ok());  // rows 0-1: covered
  auto c = copy_ops(*index, target, 6, 10);          // reaches row 2
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), "RegionNotCovered");
  EXPECT_NE(c.status().message().find("[2:3, 0:2]"), std::string::npos) << c.status().to_string();
  EXPECT_TRUE(copy_ops(*index, target, 9, 9)->ops.empty());  // empty range: nothing to copy
}

}  // namespace
}  // namespace ckpt
