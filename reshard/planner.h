// Planner: from metadata alone (source tensors and pieces, a target Layout, the model's
// ShardingRules) computes the target pieces, the writing rank (= shard file) of each, and totals.
// Pieces are de-duplicated with balance: a box held by several ranks (replicated tensors, KV heads
// shared by TP ranks, DP replicas under zero 0, the tied embedding on the first and last stage)
// is stored once, by the holder with the fewest bytes assigned so far (largest shared pieces
// first; ties by lowest rank), so replicas share a save. ZeRO-1 flat shards: see docs/RESHARD.md
// ("ZeRO-1 layout"). Any Layout form: what each rank holds comes from reshard/layout/holdings.h; where one
// tensor's boxes overlap without being equal (general layouts only) the holdings are cut into
// cells on the grid of all box boundaries (reshard/layout/overlap_cells.h) and the stored pieces are
// boxes of cells; symmetric layouts have no such overlaps (docs/RESHARD.md "General layouts").
// Thread safety: pure functions over values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/base/status.h"
#include "formats/tensor/tensor_io.h"
#include "reshard/executor.h"
#include "reshard/layout/layout.h"
#include "reshard/layout/sharding.h"
#include "reshard/layout/zero_layout.h"

namespace ckpt {

struct FileWork {
  int rank = 0;
  std::string file;             // "shards/r00003.h5"
  std::vector<size_t> pieces;   // indices into Plan::pieces, ascending
  uint64_t bytes_written = 0;
  uint64_t bytes_read = 0;      // source bytes read to fill them
};

// What the plan holds: the target pieces, the writing rank and file of each, and totals. It does
// not hold the copies: copy_ops() (reshard/source_index.h) derives the copies that fill any range
// of a target piece from the source's SourceIndex. make_plan derives them once per piece (for the
// bytes read and the coverage check), check_plan_coverage once per piece, and the executor once
// per chunk, so the copies in memory stay bounded by one chunk's.
struct Plan {
  Layout layout;
  std::vector<TensorMeta> tensors;  // global view, same as the source
  std::vector<Piece> pieces;        // ordered by rank, then tensor order, then region
  std::vector<int> piece_rank;      // writing rank of each piece
  std::vector<FileWork> files;      // one per writing rank, ascending rank
  nlohmann::json metadata;          // source metadata with "layout" replaced by the target layout
  uint64_t bytes_read = 0, bytes_written = 0;
  uint64_t source_bytes = 0;        // total bytes of the source pieces
  uint64_t peak_buffer = 0;         // executor buffer bound for the options planned with

  std::string to_string() const;    // human summary (--dry-run)
  nlohmann::json to_json() const;   // machine summary (--dry-run --json)
};

// Pieces of one tensor under `layout` before the file assignment: (rank, region) in rank order.
// Exposed for benchmarks/reshard_bench.cc.
struct RankRegion {
  int rank;
  Region region;
};

// Computes the target pieces. Refuses layouts the rules refuse (before anything is written);
// checks that the source covers every target piece (errors name the tensor and missing box) and
// totals the bytes its copies read (copy_ops per piece).
// `exec` only sizes peak_buffer.
Result<Plan> make_plan(const std::vector<TensorMeta>& src_tensors, const std::vector<Piece>& src_pieces,
                       const nlohmann::json& src_metadata, const Layout& target, const ShardingRules& rules,
                       const ExecOptions& exec = {});

// Which ranks write which elements of every tensor (each element once, by one of the ranks that
// hold it in rank_view, balanced as above), in tensor order; result[i] lists tensor i's stored
// regions in rank order. Building block of make_plan. Deterministic. A stored region is a (flat
// range of a) box its rank holds, or under a general layout whose boxes overlap a sub-box of one
// rectangle of what it holds (a held flat range is the rectangles of flat_range_to_boxes).
// Refuses what Layout::validate or check_layout_views (every stage's view) refuses.
Result<std::vector<std::vector<RankRegion>>> place_tensors(const std::vector<TensorMeta>& tensors,
                                                           const Layout& layout, const ShardingRules& rules);

// Everything rank `rank` holds in memory under `layout` (not de-duplicated: replicas included).
// ZeRO-1 optimizer state gives flat regions. The parallel trainer allocates these (trainer/optim/held_region.h).
Result<std::vector<Piece>> rank_view(const std::vector<TensorMeta>& tensors, const Layout& layout,
                                     const ShardingRules& rules, int rank);

}  // namespace ckpt
