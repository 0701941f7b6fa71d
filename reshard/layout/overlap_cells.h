// Box arithmetic for the planner when one tensor's holdings overlap without being equal (general
// layouts: pipeline 0 holds a layer at tp 2 and pipeline 1 at tp 1; a tied embedding at tp 2 on
// the first stage and tp 1 on the last; under ZeRO-1 flat ranges of such boxes). Every holding is
// taken as rectangles (a flat range as flat_range_to_boxes' at most 2*ndim-1 boxes); the grid of
// all their boundaries cuts the tensor into cells, each inside or outside every rectangle, so each
// cell's holders hold it whole. After the planner picks a writer per cell, merge_cells joins
// neighbouring cells of one writer that lie in one of its rectangles into larger boxes. The
// symmetric layouts never get here (their boxes are equal or disjoint: see planner.cc).
// Pure functions; thread safe.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "formats/tensor/region.h"
#include "reshard/layout/holdings.h"

namespace ckpt {

struct OverlapCell {
  Box box;
  std::vector<int64_t> grid;     // the cell's index on the grid, per dimension
  std::vector<int> holders;      // ascending ranks holding the whole cell
  std::vector<int> holder_rect;  // per holder: its first rectangle (an id) containing the cell
};

struct OverlapCells {
  std::vector<std::vector<int64_t>> cuts;  // per dimension: the grid boundaries, ascending
  std::vector<OverlapCell> cells;          // every cell some rectangle covers, row-major grid order
};

// The cells of the holdings hs[k], k in `list` (one tensor's; non-empty boxes of one rank).
OverlapCells cut_overlap_cells(const std::vector<Holding>& hs, const std::vector<size_t>& list);

// Joins the cells into boxes by writer: cells.cells[k] is written by writer[k] (one of its
// holders); neighbouring cells with the same writer and the same writer rectangle are merged
// greedily (row-major seed, grown along the last dimension first). Returns (writer, box) in the
// order of their first cell; together they tile the cells exactly once.
std::vector<std::pair<int, Box>> merge_cells(const OverlapCells& cells, const std::vector<int>& writer);

}  // namespace ckpt
