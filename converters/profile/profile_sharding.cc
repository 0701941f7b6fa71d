#include "converters/profile/profile_sharding.h"

#include <algorithm>
#include <utility>

#include "converters/model/tp_split.h"

namespace ckpt {

namespace {

// The model parameter behind a canonical name ("optimizer.<kind>.<param>" -> param).
std::string profile_param_of(const std::string& canonical) {
  if (!canonical.starts_with("optimizer.")) return canonical;
  const size_t dot = canonical.find('.', 10);
  return dot == std::string::npos ? canonical : canonical.substr(dot + 1);
}

Box profile_transpose_box(const Box& b) {
  Box t = b;
  std::reverse(t.offset.begin(), t.offset.end());
  std::reverse(t.extent.begin(), t.extent.end());
  return t;
}

}  // namespace

ProfileShardingRules::ProfileShardingRules(LlamaConfig config, std::vector<ProfileTensor> tensors)
    : canonical_(config), tensors_(std::move(tensors)) {
  for (const auto& t : llama_model_tensors(config, DType::kF32)) canonical_shapes_[t.name] = t.shape;
  for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
}

Status ProfileShardingRules::check_layout(const Layout& layout) const { return canonical_.check_layout(layout); }

const ProfileTensor* ProfileShardingRules::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Result<TensorPlacement> ProfileShardingRules::canonical_place(const std::string& canonical,
                                                              const Layout& layout) const {
  auto it = canonical_shapes_.find(profile_param_of(canonical));
  if (it == canonical_shapes_.end())
    return Status::Error("UnknownTensor", "profile segment of '" + canonical + "' is not a tensor of this LLaMA model")
        .with_tensor(canonical);
  return canonical_.place(TensorMeta{canonical, DType::kF32, it->second}, layout);
}

// Vocab-parallel: the even split of the stored (padded) rows, see the header.
Result<std::vector<Box>> ProfileShardingRules::vocab_boxes(const ProfileTensor& t, const Layout& layout) const {
  const Shape s = t.untransposed_shape();
  const int tp = layout.tp;
  int64_t split = std::max(s[0], layout.padded_vocab(canonical_.config().vocab_size));
  split = (split + tp - 1) / tp * tp;
  std::vector<Box> boxes;
  for (int r = 0; r < tp; ++r) {
    CKPT_ASSIGN_OR_RETURN(VocabPart v, vocab_parallel_part(s[0], split, tp, r));
    boxes.push_back(dim_slice(s, 0, v.begin, v.end));
  }
  return boxes;
}

// Each rank's part: the union of its segments' parts, which must be one box.
Result<std::vector<Box>> ProfileShardingRules::segment_boxes(const ProfileTensor& t, const Layout& layout) const {
  const Shape s = t.untransposed_shape();
  std::vector<std::vector<Box>> parts(layout.tp);
  int64_t row = 0;
  for (const auto& seg : t.segments) {
    if (seg.canonical.empty())
      return Status::Internal("profile tensor '" + t.name + "' has zero rows outside the vocabulary").with_tensor(t.name);
    CKPT_ASSIGN_OR_RETURN(TensorPlacement cp, canonical_place(seg.canonical, layout));
    for (int r = 0; r < layout.tp; ++r) {
      auto x = intersect(seg.box, cp.tp_boxes[r]);
      if (!x) continue;
      Box b = *x;
      b.offset[0] = row + (x->offset[0] - seg.box.offset[0]);
      for (size_t d = 1; d < b.ndim(); ++d) b.offset[d] = x->offset[d] - seg.box.offset[d];
      parts[r].push_back(std::move(b));
    }
    row += seg.rows();
  }
  std::vector<Box> boxes;
  for (int r = 0; r < layout.tp; ++r) {
    if (parts[r].empty()) {
      boxes.push_back(dim_slice(s, 0, 0, 0));
      continue;
    }
    Box hull = parts[r][0];
    int64_t sum = 0;
    for (const auto& b : parts[r]) {
      for (size_t d = 0; d < hull.ndim(); ++d) {
        const int64_t lo = std::min(hull.offset[d], b.offset[d]);
        const int64_t hi = std::max(hull.offset[d] + hull.extent[d], b.offset[d] + b.extent[d]);
        hull.offset[d] = lo;
        hull.extent[d] = hi - lo;
      }
      sum += b.numel();
    }
    if (sum != hull.numel())
      return Status::Error("ProfileNotSplittable",
                           "profile tensor '" + t.name + "': at tp=" + std::to_string(layout.tp) + " TP rank " +
                               std::to_string(r) + " would hold " + std::to_string(parts[r].size()) +
                               " separate pieces (" + std::to_string(sum) + " of the " + std::to_string(hull.numel()) +
                               " elements of " + hull.to_string() +
                               "); this packing cannot be split at this tp (per-TP packings are built for one tp; "
                               "q|k|v fused whole needs tp=1; Megatron groups need tp to divide the KV heads)")
          .with_tensor(t.name);
    boxes.push_back(std::move(hull));
  }
  return boxes;
}

Result<TensorPlacement> ProfileShardingRules::place(const TensorMeta& tensor, const Layout& layout) const {
  const ProfileTensor* t = find(tensor.name);
  if (!t)
    return Status::Error("UnknownTensor", "tensor '" + tensor.name + "' is not a tensor of this profile's model")
        .with_tensor(tensor.name);
  if (tensor.shape != t->shape)
    return Status::Error("ShapeMismatch", "tensor '" + tensor.name + "' has shape " + shape_to_string(tensor.shape) +
                                              ", the profile expects " + shape_to_string(t->shape))
        .with_tensor(tensor.name);
  if (layout.tp < 1 || layout.pp < 1)
    return Status::InvalidArgument("layout with tp=" + std::to_string(layout.tp) + " pp=" + std::to_string(layout.pp));
  auto first = std::find_if(t->segments.begin(), t->segments.end(), [](const auto& s) { return !s.canonical.empty(); });
  if (first == t->segments.end())
    return Status::Internal("profile tensor '" + t->name + "' has no canonical segment").with_tensor(t->name);
  TensorPlacement p;
  p.optimizer_state = t->cls == TensorClass::kOptimizer;
  CKPT_ASSIGN_OR_RETURN(TensorPlacement cp, canonical_place(first->canonical, layout));
  p.stages = cp.stages;
  const std::string param = profile_param_of(first->canonical);
  if (param == "model.embed_tokens.weight" || param == "lm_head.weight") {
    CKPT_ASSIGN_OR_RETURN(p.tp_boxes, vocab_boxes(*t, layout));
  } else {
    CKPT_ASSIGN_OR_RETURN(p.tp_boxes, segment_boxes(*t, layout));
  }
  if (t->transposed)
    for (auto& b : p.tp_boxes) b = profile_transpose_box(b);
  return p;
}

}  // namespace ckpt
