// One model-parallel group's distributed-optimizer buffer, both ways: the rank's parameters (the
// local spec's registration order, converters/megatron/megatron_segments.h names) placed by the
// bucket layout (converters/megatron/dist_optim_layout.h), and what each bucket holds as canonical
// boxes. Used by every import of the distributed optimizer (torch_dist dp_reshardable,
// dp_zero_gather_scatter) and by every export (legacy distrib_optim.pt, torch_dist dp_reshardable),
// so the layout rules exist once.
// Bucket contents (export): bucket b of a group is the run [0, numel_unpadded) of its grad buffer
// coordinates [bucket.start, bucket.start + numel_unpadded): each parameter's elements in its rank
// tensor's order (its segments, flat: a segment fills box.numel() elements) at its slot, and zero
// runs for the 64-element alignment gaps (R2). A legacy world buffer is the buckets' runs
// concatenated (get_parameter_state_dp_zero).
// Pure functions; thread safe.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "converters/megatron/dist_optim_layout.h"
#include "converters/megatron/megatron_segments.h"
#include "converters/model/llama_config.h"
#include "reshard/layout/layout.h"

namespace ckpt {

// One model-parallel group's derived layout: the rank tensors (local names) and, per slot of
// layout.params (buffer order), its tensor.
struct DistOptimGroup {
  std::vector<MegatronTensor> tensors;
  DistOptimLayout layout;
  std::vector<const MegatronTensor*> slot_tensor;
  DistOptimGroup() = default;
  DistOptimGroup(const DistOptimGroup&) = delete;  // slot_tensor points into tensors
  DistOptimGroup(DistOptimGroup&&) = default;
};

// The group of rank (tp_r, pp_r) of a model saved with `saved` and the args `args` (dp, bucket
// size: dist_optim_settings). Errors: UnsupportedDistOptim (a parameter outside the local spec's
// known registration order), the layout's. `dir` names the checkpoint in errors.
// A virtual pipeline (`vpp` > 1): `saved` is its plain pipeline of pp * vpp chunk stages
// (megatron_vpp_layout) and `pp_r` a chunk stage, whose grad buffer is that chunk's (its settings
// those of chunk pp_r / pp of pipeline rank pp_r % pp, S2).
Result<DistOptimGroup> dist_optim_group(const LlamaConfig& cfg, const Layout& saved, const nlohmann::json& args,
                                        const std::string& dir, int tp_r, int pp_r, int vpp = 1);

// Bucket by bucket, the flat segments of [0, numel_unpadded) (canonical weight names; empty =
// zeros). `rename(weight)` gives the canonical tensor a state is read from (the weight itself for
// masters without optimizer.fp32_param, optimizer.exp_avg.<weight>, ...).
template <class Rename>
std::vector<std::vector<MegatronSegment>> dist_optim_bucket_segments(const DistOptimGroup& grp, Rename rename);

// Megatron-LM's key of a grad buffer's dtype: "(torch.float32, torch.float32)" for
// (param dtype, grad dtype) names as torch prints them ("torch.float32").
std::string dist_optim_dtype_key(const std::string& param_dtype, const std::string& grad_dtype);

// ---- implementation of the template ----
template <class Rename>
std::vector<std::vector<MegatronSegment>> dist_optim_bucket_segments(const DistOptimGroup& grp, Rename rename) {
  std::vector<std::vector<MegatronSegment>> out(grp.layout.buckets.size());
  std::vector<int64_t> at(grp.layout.buckets.size(), 0);  // bucket-local elements placed so far
  for (size_t k = 0; k < grp.layout.params.size(); ++k) {
    const DistOptimSlot& slot = grp.layout.params[k];
    const int64_t local = slot.start - grp.layout.buckets[slot.bucket].start;
    auto& segs = out[slot.bucket];
    if (local > at[slot.bucket]) segs.push_back(MegatronSegment{"", {}, local - at[slot.bucket], true});  // R2 gap
    int64_t row_elems = 1;
    const MegatronTensor& t = *grp.slot_tensor[k];
    for (size_t d = 1; d < t.shape.size(); ++d) row_elems *= t.shape[d];
    for (const MegatronSegment& sg : t.segments) {
      if (sg.tensor.empty()) {
        segs.push_back(MegatronSegment{"", {}, sg.zero_rows * row_elems, true});
      } else {
        segs.push_back(MegatronSegment{rename(sg.tensor), sg.box, 0, true});
      }
    }
    at[slot.bucket] = slot.end - grp.layout.buckets[slot.bucket].start;
  }
  return out;
}

}  // namespace ckpt
