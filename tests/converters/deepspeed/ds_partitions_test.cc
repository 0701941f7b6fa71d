// DeepSpeed ZeRO partition layouts (converters/deepspeed/ds_partitions.h): the segments of stages 1/2
// and 3 against zero_to_fp32.py's rules worked by hand, one test per named error, and the flat runs
// of a sub-box.
#include "converters/deepspeed/ds_partitions.h"

#include <gtest/gtest.h>

#include <array>

namespace ckpt {
namespace {

TEST(DsPartitions, Stage12SplitsAtRankBoundariesAndPadsTheLastRank) {
  // 10 + 3 elements over 3 ranks of 5: rank 2 saves 3 (padding 2).
  auto l = ds_zero12_layout({{{"a", {2, 5}}, {"b", {3}}}}, {{5}, {5}, {3}}, {{0}, {0}, {2}}, {});
  ASSERT_TRUE(l.ok()) << l.status().message();
  ASSERT_EQ(l->size(), 2u);
  EXPECT_EQ((*l)[0].segments, (std::vector<DsSegment>{{0, 0, 0, 0, 5}, {1, 0, 0, 5, 5}}));
  EXPECT_EQ((*l)[1].segments, (std::vector<DsSegment>{{2, 0, 0, 0, 3}}));
}

TEST(DsPartitions, Stage12AlignmentPaddingsSkipElements) {
  auto l = ds_zero12_layout({{{"a", {3}}, {"b", {2}}}}, {{3}, {3}}, {{0}, {0}}, {{1, 0}});
  ASSERT_TRUE(l.ok()) << l.status().message();
  EXPECT_EQ((*l)[1].segments, (std::vector<DsSegment>{{1, 0, 1, 0, 2}}));
}

TEST(DsPartitions, Stage12Errors) {
  const std::vector<std::vector<int64_t>> none{{0}, {0}};
  EXPECT_EQ(ds_zero12_layout({{{"a", {4}}}}, {{2}, {3}}, none, {}).status().code(), "DeepSpeedPartitionSize");
  EXPECT_EQ(ds_zero12_layout({{{"a", {4}}}}, {{2}, {2, 1}}, none, {}).status().code(), "DeepSpeedPartitionCount");
  EXPECT_EQ(ds_zero12_layout({{{"a", {1}}}}, {{2}, {0}}, {{0}, {3}}, {}).status().code(), "DeepSpeedPadding");  // larger than a partition
  EXPECT_EQ(ds_zero12_layout({{{"a", {1}}}}, {{2}, {2}}, {{0}, {-1}}, {}).status().code(), "DeepSpeedPadding");
  EXPECT_EQ(ds_zero12_layout({{{"a", {1}, }}}, {{2}, {2}}, {{0}}, {}).status().code(), "DeepSpeedPadding");  // one rank's paddings
  EXPECT_EQ(ds_zero12_layout({{{"a", {3}}}}, {{2}, {2}}, none, {}).status().code(), "DeepSpeedGroupSize");  // one element left over
  EXPECT_EQ(ds_zero12_layout({{{"a", {5}}}}, {{2}, {2}}, none, {}).status().code(), "DeepSpeedGroupSize");  // runs past
  EXPECT_EQ(ds_zero12_layout({{{"a", {-1}}}}, {{2}, {2}}, none, {}).status().code(), "DeepSpeedParamShape");
}

TEST(DsPartitions, Stage3CutsEveryParameterOverTheRanks) {
  // a: 5 elements -> 2 per rank (rank 2 holds 1 + 1 padding); b: 3 -> 1 per rank. Per rank 3.
  auto l = ds_zero3_layout({{"a", {5}}, {"b", {3}}}, {{3}, {3}, {3}});
  ASSERT_TRUE(l.ok()) << l.status().message();
  EXPECT_EQ((*l)[0].segments, (std::vector<DsSegment>{{0, 0, 0, 0, 2}, {1, 0, 0, 2, 2}, {2, 0, 0, 4, 1}}));
  EXPECT_EQ((*l)[1].segments, (std::vector<DsSegment>{{0, 0, 2, 0, 1}, {1, 0, 2, 1, 1}, {2, 0, 2, 2, 1}}));
}

TEST(DsPartitions, Stage3PieceSpansTwoGroups) {
  // a: 4 over 2 ranks -> 2 each, at 0 of groups of sizes {1, 1}: 1 from group 0, 1 from group 1.
  auto l = ds_zero3_layout({{"a", {4}}}, {{1, 1}, {1, 1}});
  ASSERT_TRUE(l.ok()) << l.status().message();
  EXPECT_EQ((*l)[0].segments,
            (std::vector<DsSegment>{{0, 0, 0, 0, 1}, {0, 1, 0, 1, 1}, {1, 0, 0, 2, 1}, {1, 1, 0, 3, 1}}));
}

TEST(DsPartitions, ErrorsNameTheRank) {
  int rank = -1;
  EXPECT_EQ(ds_zero12_layout({{{"a", {1}}}}, {{2}, {0}, {1}}, {{0}, {0}, {9}}, {}, &rank).status().code(), "DeepSpeedPartitionSize");
  EXPECT_EQ(rank, 1);
  rank = -1;
  EXPECT_EQ(ds_zero3_layout({{"a", {4}}}, {{2}, {2}, {1}}, &rank).status().code(), "DeepSpeedPartitionSize");
  EXPECT_EQ(rank, 2);
}

TEST(DsPartitions, Stage3Errors) {
  EXPECT_EQ(ds_zero3_layout({{"a", {4}}}, {{2}, {3}}).status().code(), "DeepSpeedPartitionSize");
  EXPECT_EQ(ds_zero3_layout({{"a", {4}}}, {{2}, {1, 1}}).status().code(), "DeepSpeedPartitionCount");
  EXPECT_EQ(ds_zero3_layout({{"a", {4}}}, {{3}, {3}}).status().code(), "DeepSpeedGroupSize");
  EXPECT_EQ(ds_zero3_layout({{"a", {8}}}, {{3}, {3}}).status().code(), "DeepSpeedGroupSize");
}

TEST(DsPartitions, FlatRunsOfASubBox) {
  std::vector<std::array<int64_t, 3>> runs;
  auto collect = [&](int64_t f, int64_t o, int64_t n) {
    runs.push_back({f, o, n});
    return Status::Ok();
  };
  ASSERT_TRUE(ds_for_each_flat_run({4, 8}, Box{{1, 2}, {2, 3}}, collect).ok());
  EXPECT_EQ(runs, (std::vector<std::array<int64_t, 3>>{{10, 0, 3}, {18, 3, 3}}));
  runs.clear();
  ASSERT_TRUE(ds_for_each_flat_run({4, 8}, Box{{1, 0}, {2, 8}}, collect).ok());  // whole rows: one run
  EXPECT_EQ(runs, (std::vector<std::array<int64_t, 3>>{{8, 0, 16}}));
  runs.clear();
  ASSERT_TRUE(ds_for_each_flat_run({}, Box::whole({}), collect).ok());  // a scalar
  EXPECT_EQ(runs, (std::vector<std::array<int64_t, 3>>{{0, 0, 1}}));
  EXPECT_FALSE(ds_for_each_flat_run({4}, Box{{3}, {2}}, collect).ok());  // outside the shape
}

}  // namespace
}  // namespace ckpt
