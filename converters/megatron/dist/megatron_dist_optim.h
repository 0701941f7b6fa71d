// The distributed optimizer's dp_reshardable state of a Megatron-Core torch_dist checkpoint
// (megatron-core 0.17 .. 0.19, DistributedOptimizer.sharded_param_state_dp_reshardable) as pieces
// of canonical tensors: one 1-D tensor per model-parallel group g (= tp_rank + tp * pp_rank),
// grad buffer i, dtype and bucket b and state (param = fp32 master, exp_avg, exp_avg_sq):
// `optimizer.distributed.dp_group_idx_{g}.gbuf_idx_{i}.dtype_{dt}.bucket_idx_{b}.{state}`, of
// global size the bucket's numel_unpadded, bucket-local coordinates. Where each parameter sits is
// derived (converters/megatron/dist_optim_layout.h) from the model the args describe (the
// local spec's parameter order) and checked against the recorded sizes; each rank parameter's
// segments (converters/megatron/megatron_segments.h) give the canonical boxes. Replicated tensors
// (norms) are taken from TP rank 0. Moments: those of args.optimizer (Lion: exp_avg; others: exp_avg,
// exp_avg_sq). Named errors: MissingDistOptimState (a moment of args.optimizer in no bucket, a bucket without a state
// the others have, or without masters), DistOptimRangeNotCovered (a parameter's elements not all
// in the DCP chunks), UnsupportedDistOptim (several grad buffers), and the layout's.
// Thread safety: the plan is a value; read_dist_optim uses `dcp` (one thread at a time).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "converters/megatron/dist_optim_group.h"
#include "converters/megatron/dist_optim_layout.h"
#include "converters/megatron/megatron_segments.h"
#include "converters/model/llama_config.h"
#include "formats/torch/dcp/dcp.h"
#include "formats/torch/torch_file.h"
#include "formats/tensor/tensor_io.h"
#include "reshard/layout/layout.h"

namespace ckpt {

inline constexpr const char* kDistOptimBucketPrefix = "optimizer.distributed.dp_group_idx_";

// One canonical box read from a bucket: element x of `box` at bucket offset
// flat + ravel(x - box.offset, box.extent).
struct DistOptimPiece {
  std::string tensor;  // canonical name: the weight (masters) or optimizer.<state>.<weight>
  Box box;
  size_t dcp_tensor = 0;  // index in the DCP source's tensors()
  int64_t flat = 0;
  int world = -1;         // >= 0: read from plan.worlds[world] instead (dp_zero_gather_scatter)
};

// A gathered world buffer (every bucket unpadded, concatenated) inside a torch.save zip.
struct DistOptimWorld {
  std::shared_ptr<torch::TorchFile> file;
  torch::TensorRef tensor;
};

struct DistOptimPlan {
  std::vector<DistOptimPiece> pieces;
  std::set<std::string> dcp_read;  // the bucket tensors used
  std::vector<std::string> states;  // e.g. {"exp_avg", "exp_avg_sq", "param"}
  std::vector<DistOptimWorld> worlds;
  std::set<std::string> items_read;  // DCP bytes items used (dp_zero_gather_scatter's param_state)
  std::string not_imported_reason;  // non-empty: the form is recognised but not read (pieces empty)
};

// Appends the pieces of `grp` (each canonical box once over all groups: `seen`): `at(slot, state,
// bucket-local offset, elements)` gives the piece's source (tensor and box are filled here), or
// nullopt to skip it.
void add_group_pieces(const DistOptimGroup& grp, const std::vector<std::string>& states,
                      const std::function<std::optional<DistOptimPiece>(size_t, const std::string&, int64_t, int64_t)>& at,
                      std::set<std::pair<std::string, Shape>>& seen, DistOptimPlan& plan);

// nullopt when the DCP holds no bucket tensors. `saved`: the saved tp/pp and stage split;
// `vpp`: the virtual pipeline size (> 1 is named as not imported).
Result<std::optional<DistOptimPlan>> plan_dp_reshardable(const TensorSource& dcp, const LlamaConfig& cfg,
                                                         const Layout& saved, int64_t vpp, const nlohmann::json& args,
                                                         const std::string& dir);

// dp_zero_gather_scatter: the ShardedObjects optimizer.distributed.dp_group_idx_{g}.param_state
// (megatron-core's get_parameter_state_dp_zero(): {buckets_coalesced: True, 0: {(dtype, dtype):
// {param, exp_avg, exp_avg_sq (world buffers), numel_unpadded}}}), read through the restricted
// unpickler; a parameter's world offset is its bucket-local start plus the earlier buckets'
// numel_unpadded. nullopt when there are no such items. Errors as plan_dp_reshardable, plus
// BadDistOptimState (not that structure, an item outside its file).
Result<std::optional<DistOptimPlan>> plan_dp_zero(const torch::DcpMetadata& md, const LlamaConfig& cfg,
                                                  const Layout& saved, int64_t vpp, const nlohmann::json& args,
                                                  const std::string& dir);

// Reads `sub` (canonical coordinates inside p.box) of `p` into `dst`; `chunks`: the DCP pieces of
// p's bucket tensor; `worlds`: the plan's world buffers.
Status read_dist_optim(TensorSource& dcp, const std::vector<size_t>& chunks, const std::vector<DistOptimWorld>& worlds,
                       const DistOptimPiece& p, const Box& sub, void* dst);

}  // namespace ckpt
