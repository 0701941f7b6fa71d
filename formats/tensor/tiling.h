// Whether the pieces of one tensor tile it: every piece inside the tensor, no element held by two
// pieces and (when asked) every element held by one. The one home of that check: the native
// store's manifest and shard writer, the DCP writer and .metadata reader, and the DCP export map
// its fault to their own error codes and messages.
// Pure functions; thread safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "formats/tensor/region.h"

namespace ckpt {

struct TilingRules {
  // Pieces may be flat ranges of a box (Region::is_flat). With `cover`, the flat pieces of one box
  // must then tile [0, numel(box)) of that box (the store's rule for ZeRO-style shards); without
  // it, only their overlaps are faults. false: a flat piece is a fault (kNotABox).
  bool flat_ranges = false;
  // Every element must be held by a piece (false: a partial set, e.g. one rank's pieces, or a DCP
  // whose holes are reported when read; only misplaced and overlapping pieces are faults).
  bool cover = true;
};

struct TilingFault {
  enum class Kind {
    kBadShape,     // the tensor's shape has a negative dimension or too many elements (detail)
    kNotABox,      // piece `a` is a flat range where the rules allow only boxes
    kOutside,      // piece `a`'s box is not inside the tensor (detail: validate_box's message)
    kFlatOutside,  // piece `a`'s flat range is not inside [0, numel(its box)]
    kFlatOverlap,  // the flat ranges of pieces `a` < `b`, of one box, share element `at` of that box
    kFlatGap,      // no flat piece of piece `a`'s box holds element `at` of it (the first missing one)
    kOverlap,      // pieces `a` < `b` share an element
    kGap,          // the pieces hold `covered` of the tensor's `total` elements
  };
  Kind kind = Kind::kGap;
  size_t a = 0, b = 0;
  int64_t at = 0;
  int64_t covered = 0, total = 0;
  std::string detail;
};

// The first fault of `pieces` (regions of one tensor of shape `shape`), checked in this order:
// the shape; each piece in index order (kNotABox, kOutside, kFlatOutside); the flat ranges of each
// box (kFlatOverlap, then with `cover` kFlatGap); overlaps between pieces; with `cover`, coverage.
// Pieces holding no element never overlap. A rank-0 tensor has one element: two pieces that hold
// it overlap. Cost: O(n log n) in the number of boxes when the pieces are cut along at most two
// dimensions (every other dimension the same interval for all); else a sweep along the dimension
// with the most distinct offsets that compares a box only with the boxes active there whose
// interval along a second dimension can meet it.
std::optional<TilingFault> find_tiling_fault(const Shape& shape, std::span<const Region> pieces,
                                             const TilingRules& rules = {});

// Two boxes of `boxes` (same rank, each valid: validate_box) that share an element, as indices
// (first < second), or nullopt when they are pairwise disjoint. Empty boxes meet nothing. Same cost
// as find_tiling_fault.
std::optional<std::pair<size_t, size_t>> find_box_overlap(std::span<const Box> boxes);

}  // namespace ckpt
