// SourceIndex: the boxes a TensorSource's pieces hold, per tensor, validated once; assign_box
// splits any box of a global tensor over them; copy_ops derives the copies that fill a range of a
// target piece (the one derivation that the planner's totals, the coverage check and the
// executor's chunks share). Thread safety: an index is a value; functions are pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "formats/base/status.h"
#include "formats/tensor/region.h"
#include "formats/tensor/tensor_io.h"

namespace ckpt {

// Per tensor, the boxes the source pieces hold (a flat piece contributes each box of
// Region::boxes()), for fast lookup. Built from (and validated against) a source's listing.
struct SourceIndex {
  struct Entry {
    size_t piece;  // index into TensorSource::pieces()
    Box box;       // global coordinates; for a flat piece one box of its region
  };
  std::unordered_map<std::string, std::vector<Entry>> by_tensor;
  std::unordered_map<std::string, size_t> tensor_index;  // name -> index in TensorSource::tensors()

  // Validates the listing (unique tensor names, every piece names a known tensor, has its rank,
  // lies inside its tensor, flat ranges inside their box) and indexes it. `what` names the source
  // in messages.
  static Result<SourceIndex> build(const std::vector<TensorMeta>& tensors, const std::vector<Piece>& pieces,
                                   const std::string& what = "source");
  static Result<SourceIndex> build(const TensorSource& src) {
    return build(src.tensors(), src.pieces(), src.describe());
  }
  const std::vector<Entry>* find(const std::string& tensor) const;
};

// One part of a box: which source piece provides which sub-box.
struct SourcePart {
  size_t piece;
  Box box;  // global coordinates, inside the piece (inside one box of a flat piece)
};

// Splits `box` of `tensor` into parts served by source pieces (the first piece in index order
// wins where pieces overlap). An uncovered part is a kNotFound error, code "RegionNotCovered",
// naming the tensor, the requested box and the first missing sub-box.
Result<std::vector<SourcePart>> assign_box(const SourceIndex& index, const std::string& tensor, const Box& box);

// The copies that fill elements [begin, end) (storage order, counted from the piece's first
// element) of a target piece: the range as boxes of the tensor (at most 2*ndim-1; a rank-0 piece
// is its one box), and per box the source parts that cover it.
struct CopyOps {
  struct Op {
    SourcePart part;
    size_t box;  // index into `boxes` of the box the part lies in
  };
  std::vector<Box> boxes;       // in storage order
  std::vector<int64_t> box_off; // element offset of each box in the range
  std::vector<Op> ops;          // per box in order, its parts in assign_box order
};

// Errors are assign_box's (a part no source piece holds), without target context: the caller adds it.
// `target` must be valid for its tensor (validate_box, flat_range_fits) and 0 <= begin <= end <= numel.
Result<CopyOps> copy_ops(const SourceIndex& index, const Piece& target, int64_t begin, int64_t end);

// "piece 3 (w [0:4, 2:5] F32)": a piece in messages.
std::string piece_desc(size_t i, const Piece& p);

}  // namespace ckpt
