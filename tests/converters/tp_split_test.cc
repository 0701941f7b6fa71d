// vocab_parallel_part against a row-by-row reference: every padded row index belongs to rank
// row / (padded / tp), and is real when below the vocabulary size.
#include "converters/model/tp_split.h"

#include <gtest/gtest.h>

#include <tuple>

#include "reshard/layout/layout.h"

namespace ckpt {
namespace {

TEST(TpSplit, VocabPartsMatchRowByRowAssignment) {
  for (int64_t vocab : {1, 5, 37, 64, 129})
    for (int tp : {1, 2, 3, 4, 8})
      for (int64_t divisor : {1, 8, 128}) {
        Layout l;
        l.tp = tp;
        l.vocab_divisor = divisor;
        const int64_t padded = l.padded_vocab(vocab);
        const int64_t part = padded / tp;
        for (int r = 0; r < tp; ++r) {
          int64_t first_real = -1, real = 0, pad = 0;
          for (int64_t row = 0; row < padded; ++row) {
            if (row / part != r) continue;
            if (row < vocab) {
              if (first_real < 0) first_real = row;
              ++real;
            } else {
              ++pad;
            }
          }
          auto v = vocab_parallel_part(vocab, padded, tp, r);
          ASSERT_TRUE(v.ok());
          EXPECT_EQ(v->end - v->begin, real) << vocab << " " << tp << " " << r;
          if (real > 0) {
            EXPECT_EQ(v->begin, first_real);
          }
          EXPECT_EQ(v->padding, pad) << vocab << " " << tp << " " << r;
        }
      }
}

TEST(TpSplit, RefusesImpossiblePadding) {
  for (auto [vocab, padded, tp, rank] : {std::tuple{10, 9, 1, 0},    // padded < vocab
                                         std::tuple{10, 11, 2, 0},   // not a multiple of tp
                                         std::tuple{10, 12, 2, 2}}) {  // rank outside tp
    auto v = vocab_parallel_part(vocab, padded, tp, rank);
    ASSERT_FALSE(v.ok());
    EXPECT_EQ(v.status().kind(), ErrorKind::kInternal);
  }
  EXPECT_TRUE(vocab_parallel_part(10, 12, 2, 1).ok());
}

TEST(TpSplit, DimSliceTakesOneDimension) {
  const Box b = dim_slice({6, 4, 2}, 1, 1, 3);
  EXPECT_EQ(b.offset, (Shape{0, 1, 0}));
  EXPECT_EQ(b.extent, (Shape{6, 2, 2}));
}

}  // namespace
}  // namespace ckpt
