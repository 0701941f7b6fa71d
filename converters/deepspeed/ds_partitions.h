// Where each parameter of a DeepSpeed ZeRO checkpoint lies in the ranks' flat fp32 partitions
// (the rules of deepspeed/utils/zero_to_fp32.py, DeepSpeed 0.19.8), as pure functions of the sizes
// the files declare. A parameter is a list of segments: a run of its row-major elements held by one
// rank's flat group tensor. The same segments address the Adam moments (exp_avg, exp_avg_sq are
// flat tensors of the same size as the partition they belong to).
//
// Stages 1 and 2 (single_partition_of_fp32_groups): param group g is one flat vector padded to
// world * P_g elements and cut into `world` partitions of P_g; each rank saves its partition less
// its group_paddings[g] (the padding: on the last rank), so the saved partitions, concatenated in
// rank order, are the group's elements. The group's parameters (param_shapes[g], in order) lie
// back to back from 0, each followed by its param_alignment_paddings[g][k] when the file has them.
// (The Adam moments keep the padding at the end of the last rank's partition: the same offsets.)
// Rules, one named error each:
//   DeepSpeedPartitionCount  every group has a partition on every rank (as many groups per rank)
//   DeepSpeedPartitionSize   saved partition + padding is of one size P_g on every rank
//   DeepSpeedPadding         a padding is not negative nor larger than P_g; alignment paddings
//                            one per parameter, not negative
//   DeepSpeedGroupSize       parameters + alignment paddings fill the saved partitions exactly
// Stage 3 (fp32_flat_groups): every parameter is cut into ceil(numel / world) elements per rank
// (the last rank's piece padded); each rank's flat groups, concatenated, hold the parameters'
// pieces back to back in param_shapes order (over all groups). Rules:
//   DeepSpeedPartitionCount, DeepSpeedPartitionSize (a rank's groups as rank 0's)
//   DeepSpeedGroupSize       the pieces fill the ranks' concatenated groups exactly
// Both: DeepSpeedParamShape (a negative dimension, an element count beyond 2^62). An error about
// one rank's sizes sets *failed_rank (when given) to that rank, so the caller names its file.
// Pure functions; thread safe.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "formats/base/status.h"
#include "formats/tensor/region.h"

namespace ckpt {

struct DsParamShape {
  std::string name;
  Shape shape;
};

// A run of a parameter's elements [param_begin, param_begin + numel) (row-major) held by rank
// `rank`'s flat group `group` at element `offset`.
struct DsSegment {
  int rank = 0;
  int group = 0;
  int64_t offset = 0;
  int64_t param_begin = 0;
  int64_t numel = 0;
  bool operator==(const DsSegment& o) const = default;
};

struct DsParamLayout {
  std::string name;
  Shape shape;
  int64_t numel = 0;
  std::vector<DsSegment> segments;  // in param_begin order, tiling [0, numel)
};

// Stages 1/2. `groups[g]`: param_shapes[g]; `partition_numel[r][g]`: the size of rank r's saved
// partition of group g; `group_paddings[r][g]` rank r's; `alignment_paddings` empty or [g][k].
Result<std::vector<DsParamLayout>> ds_zero12_layout(const std::vector<std::vector<DsParamShape>>& groups,
                                                   const std::vector<std::vector<int64_t>>& partition_numel,
                                                   const std::vector<std::vector<int64_t>>& group_paddings,
                                                   const std::vector<std::vector<int64_t>>& alignment_paddings,
                                                   int* failed_rank = nullptr);

// Stage 3. `params`: param_shapes over all groups, in order; `flat_numel[r][g]`: the size of rank
// r's flat group g.
Result<std::vector<DsParamLayout>> ds_zero3_layout(const std::vector<DsParamShape>& params,
                                                  const std::vector<std::vector<int64_t>>& flat_numel, int* failed_rank = nullptr);

// Calls fn(flat_begin, out_begin, count) for each run of `sub`'s elements that is contiguous in the
// row-major order of `shape` (trailing dimensions taken whole merged), in sub's row-major order:
// flat_begin the run's first element's index in `shape`, out_begin its index in a dense sub buffer.
// `sub` must lie inside `shape` (validate_box).
Status ds_for_each_flat_run(const Shape& shape, const Box& sub,
                         const std::function<Status(int64_t flat_begin, int64_t out_begin, int64_t count)>& fn);

}  // namespace ckpt
