// ProfileShardingRules: where every tensor of a profile (converters/profile/profile.h) lives under a Layout.
// Derived from the canonical rules (converters/model/llama_sharding.h), segment by segment:
//   - a TP rank's part of a profile tensor is the union of its segments' parts: each segment's
//     canonical box intersected with the canonical rank box (column-parallel q/k/v/gate/up rows,
//     row-parallel o/down columns, replicated norms and row-parallel biases), placed at the
//     segment's rows; that union must be one box, else ProfileNotSplittable (e.g. q|k|v fused
//     whole at tp > 1, per-TP packings built for another tp, Megatron groups with tp > KV heads);
//   - embedding and output head (and their optimizer state) are vocab-parallel over the profile's
//     rows, padding included: rank r holds rows [r*Q, (r+1)*Q) clipped to the stored rows, with
//     Q = max(stored rows, layout.padded_vocab(V)) / tp rounded up (for an unpadded profile this is
//     exactly LlamaShardingRules' split, for a Megatron-padded one the even split of the padded rows);
//   - a transposed tensor's boxes are the transposes of the untransposed ones (columns become rows);
//   - pipeline stages are the canonical tensors'; optimizer tensors are optimizer state.
// Immutable after construction; thread safe (const methods only).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "converters/model/llama_sharding.h"
#include "converters/profile/profile.h"
#include "reshard/layout/sharding.h"

namespace ckpt {

class ProfileShardingRules : public ShardingRules {
 public:
  // `tensors`: profile_tensors(profile, config, canonical, tp) (per-TP packings: the layout's tp).
  ProfileShardingRules(LlamaConfig config, std::vector<ProfileTensor> tensors);

  // The canonical rules' checks (LlamaShardingRules::check_layout).
  Status check_layout(const Layout& layout) const override;
  // Placement of a profile tensor (name and stored shape as in `tensors`). UnknownTensor,
  // ShapeMismatch, ProfileNotSplittable (naming the tensor, the rank and tp).
  Result<TensorPlacement> place(const TensorMeta& tensor, const Layout& layout) const override;

  const std::vector<ProfileTensor>& tensors() const { return tensors_; }
  const ProfileTensor* find(const std::string& name) const;  // nullptr when absent

 private:
  Result<std::vector<Box>> segment_boxes(const ProfileTensor& t, const Layout& layout) const;
  Result<std::vector<Box>> vocab_boxes(const ProfileTensor& t, const Layout& layout) const;
  Result<TensorPlacement> canonical_place(const std::string& canonical, const Layout& layout) const;

  LlamaShardingRules canonical_;
  std::map<std::string, Shape> canonical_shapes_;  // model tensors (HF shapes)
  std::vector<ProfileTensor> tensors_;
  std::map<std::string, size_t> index_;
};

}  // namespace ckpt
