#include "reshard/source_index.h"

#include <optional>
#include <utility>

namespace ckpt {

std::string piece_desc(size_t i, const Piece& p) {
  return "piece " + std::to_string(i) + " (" + p.tensor + " " + p.region.to_string() + " " +
         std::string(dtype_name(p.dtype)) + ")";
}

Result<SourceIndex> SourceIndex::build(const std::vector<TensorMeta>& tensors, const std::vector<Piece>& pieces,
                                       const std::string& what) {
  SourceIndex idx;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorMeta& t = tensors[i];
    auto n = shape_numel(t.shape);
    if (!n.ok()) return n.take_status().with_tensor(t.name).with_context(what);
    if (!idx.tensor_index.emplace(t.name, i).second)
      return Status::Error("DuplicateTensor", what + ": tensor '" + t.name + "' is listed twice").with_tensor(t.name);
  }
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    auto it = idx.tensor_index.find(p.tensor);
    if (it == idx.tensor_index.end())
      return Status::Error("UnknownTensor", what + ": " + piece_desc(i, p) + " names a tensor that is not listed")
          .with_tensor(p.tensor);
    const TensorMeta& t = tensors[it->second];
    Status st = validate_box(p.region.box, t.shape);
    if (!st.ok()) return std::move(st).with_tensor(p.tensor).with_context(what + ": " + piece_desc(i, p));
    if (p.region.is_flat()) {
      const int64_t n = p.region.box.numel();
      if (!flat_range_fits(p.region))
        return Status::Error("FlatRangeOutOfBounds", what + ": " + piece_desc(i, p) + ": flat range " +
                                                              std::to_string(p.region.flat_begin) + ".." +
                                                              std::to_string(p.region.flat_end) + " outside 0.." +
                                                              std::to_string(n) + " of its box")
            .with_tensor(p.tensor);
    } else if (p.region.flat_end != -1) {
      return Status::Error("FlatRangeOutOfBounds", what + ": " + piece_desc(i, p) + ": flat_end " +
                                                            std::to_string(p.region.flat_end) + " is negative")
          .with_tensor(p.tensor);
    }
    auto& entries = idx.by_tensor[p.tensor];
    for (Box& b : p.region.boxes())
      if (!b.empty() || b.ndim() == 0) entries.push_back({i, std::move(b)});
  }
  return idx;
}

const std::vector<SourceIndex::Entry>* SourceIndex::find(const std::string& tensor) const {
  auto it = by_tensor.find(tensor);
  return it == by_tensor.end() ? nullptr : &it->second;
}

Result<std::vector<SourcePart>> assign_box(const SourceIndex& index, const std::string& tensor, const Box& box) {
  std::vector<SourcePart> parts;
  if (box.empty() && box.ndim() > 0) return parts;
  const auto* entries = index.find(tensor);
  if (!index.tensor_index.count(tensor))
    return Status::Error("TensorNotFound", "the source has no tensor '" + tensor + "'")
        .with_tensor(tensor);
  std::vector<Box> remaining{box}, next;
  if (entries) {
    for (const auto& e : *entries) {
      if (remaining.empty()) break;
      if (e.box.ndim() != box.ndim()) continue;
      next.clear();
      for (const Box& r : remaining) {
        std::optional<Box> x = intersect(r, e.box);
        if (r.ndim() == 0) x = r;  // rank 0: a piece holding the scalar covers it
        if (!x) {
          next.push_back(r);
          continue;
        }
        subtract_box(r, *x, next);
        parts.push_back({e.piece, std::move(*x)});
      }
      remaining.swap(next);
    }
  }
  if (!remaining.empty()) {
    int64_t missing = 0;
    for (const Box& r : remaining) missing += r.numel();
    return Status::Error("RegionNotCovered",
                         "no source piece holds box " + remaining.front().to_string() + " of tensor '" + tensor +
                             "' (requested " + box.to_string() + ", " + std::to_string(missing) + " of " +
                             std::to_string(box.numel()) + " elements missing)")
        .with_tensor(tensor);
  }
  return parts;
}

Result<CopyOps> copy_ops(const SourceIndex& index, const Piece& target, int64_t begin, int64_t end) {
  CopyOps c;
  if (begin >= end) return c;
  const Box& box = target.region.box;
  const int64_t base = target.region.is_flat() ? target.region.flat_begin : 0;
  c.boxes = box.ndim() == 0 ? std::vector<Box>{box} : flat_range_to_boxes(box, base + begin, base + end);
  int64_t off = 0;
  for (size_t k = 0; k < c.boxes.size(); ++k) {
    c.box_off.push_back(off);
    off += c.boxes[k].numel();
    CKPT_ASSIGN_OR_RETURN(std::vector<SourcePart> parts, assign_box(index, target.tensor, c.boxes[k]));
    for (SourcePart& p : parts) c.ops.push_back({std::move(p), k});
  }
  return c;
}

}  // namespace ckpt
