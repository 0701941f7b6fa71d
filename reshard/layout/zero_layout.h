// The ZeRO-1 flat layout (docs/RESHARD.md "ZeRO-1 layout"), one definition for the planner
// (which pieces a rank stores) and the trainer (which optimizer elements a rank updates):
// per (pipeline stage, TP rank, optimizer kind) one flat buffer of the TP boxes of the stage's
// optimizer tensors of that kind, in tensor-list order, flattened row-major and concatenated,
// zero-padded at the end to a multiple of kZeroPadElements * dp, split evenly over the DP ranks:
// DP rank d holds [d*S, (d+1)*S), S = padded / dp.
// General layouts (reshard/layout/layout.h): ZeRO-1 needs uniform_pipelines(), so stage s has one tp,
// ep and etp (which may differ from other stages') in every pipeline; its buffers are those of
// layout.stage_view(0, s) (dp = num_pipelines()), and DP rank d is pipeline d; its expert buffers
// group the stage's ranks of every pipeline by the expert boxes the stage's view gives them.
// Pure functions over values; thread safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "formats/base/status.h"
#include "formats/tensor/region.h"
#include "formats/tensor/tensor_io.h"
#include "reshard/layout/layout.h"
#include "reshard/layout/sharding.h"
#include "reshard/layout/tensor_placement.h"

namespace ckpt {

// ZeRO-1 flat buffers are padded to a multiple of kZeroPadElements * dp elements, so every DP
// rank's shard is a whole number of kZeroPadElements-element blocks.
inline constexpr int64_t kZeroPadElements = 128;

// One tensor's TP box inside a flat buffer: elements [offset, offset + numel) of the buffer are
// the box's elements in row-major order.
struct ZeroSegment {
  size_t tensor = 0;   // index into the tensor list
  Box box;             // the tensor's TP box (of the buffer's TP rank)
  int64_t offset = 0;  // first element in the flat buffer
  int64_t numel = 0;   // the TP box's element count (may be 0: a vocab shard of padding only)
};

struct ZeroBuffer {
  int stage = 0;
  int tp_rank = 0;
  std::string kind;                   // "optimizer.exp_avg", "optimizer.exp_avg_sq", ...
  std::vector<ZeroSegment> segments;  // tensor-list order, contiguous from offset 0
  int64_t total = 0;                  // sum of the segments' numel
  int64_t padded = 0;                 // total rounded up to a multiple of kZeroPadElements * dp
  int dp = 1;
  // An expert buffer's holders (TensorPlacement::expert): shard d is held by (pipeline, tp rank)
  // members[d], the ranks of the stage holding the same expert boxes, in stage-local rank order
  // (pipeline * tp + tp rank); tp_rank is members[0]'s. Empty for a dense buffer: shard d is
  // (pipeline d, tp_rank).
  std::vector<std::pair<int, int>> members;

  std::pair<int, int> holder(int d) const { return members.empty() ? std::pair<int, int>{d, tp_rank} : members[d]; }
  int64_t shard() const { return padded / dp; }
  // DP rank d's elements [lo, hi) of the buffer.
  std::pair<int64_t, int64_t> range(int d) const { return {d * shard(), (d + 1) * shard()}; }
};

// "optimizer.exp_avg.model.x" -> "optimizer.exp_avg": the buffer kind of an optimizer tensor.
std::string zero_kind(const std::string& name);

// Every non-empty flat buffer of `layout` (whatever layout.zero says; either form), ordered by
// stage, then TP rank (of that stage's tp), then kind (kinds in the order of their first tensor);
// then the stage's expert buffers (expert tensors of an expert-parallel layout, left out of the
// dense ones): per group of ranks holding the same expert boxes (the expert data-parallel group,
// groups in the order of their first rank), per kind, dp = the group's size.
// `placed[i]` is tensor i's place_in_layout (reshard/layout/tensor_placement.h); pipeline 0's placements
// define the buffers; only tensors with optimizer_state take part; dp = num_pipelines().
// Errors: Unsupported when the pipelines are not uniform (ZeRO-1 has no DP group there),
// ZeroBufferOverflow when a buffer's size overflows int64.
Result<std::vector<ZeroBuffer>> zero_buffers(const std::vector<TensorMeta>& tensors,
                                             const std::vector<std::vector<StagePlacement>>& placed,
                                             const Layout& layout);

// The dense buffer of one (stage, TP rank, kind), placing the tensors with `rules` (errors name the
// tensor); expert tensors of an expert-parallel layout (or view) are left out, as zero_buffers
// keeps them in its expert buffers. A buffer with no tensors comes back with no segments and total 0. `layout` may be the
// general form (with uniform pipelines; its stage_view(0, stage) is used) or any stage view of it,
// layout.stage_view(p, stage): the result equals zero_buffers(...)'s buffer of (stage, tp_rank,
// kind).
Result<ZeroBuffer> zero_buffer(const std::vector<TensorMeta>& tensors, const Layout& layout,
                               const ShardingRules& rules, int stage, int tp_rank, const std::string& kind);

}  // namespace ckpt
