// Megatron-LM's legacy distributed optimizer state: `distrib_optim.pt` beside a rank's
// model_optim_rng.pt (DistributedOptimizer.save_parameter_state on DP rank 0; megatron-core's
// get_parameter_state_dp_zero()): {"buckets_coalesced": True, <gbuf>: {(param dtype, grad dtype):
// {param, exp_avg, exp_avg_sq (world buffers: the buckets unpadded, concatenated), numel_unpadded}}}.
// Each parameter's place is derived (converters/megatron/dist_optim_layout.h) from the rank's model
// parameters in 'model' order (= registration order) and the args, and checked against
// numel_unpadded; its moments (and masters, for non-fp32 parameters) become views of the world
// buffers shaped as the parameter, named kMegatronOptimPrefixes[k] + mcore name. The same structure
// is torch_dist dp_zero_gather_scatter's param_state (converters/megatron/dist/).
// Thread safety: a value; reading through `file` is one thread at a time.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "converters/megatron/megatron_torch_optim.h"
#include "formats/torch/torch_file.h"

namespace ckpt {

// The world buffers of grad buffer `gbuf` of `d` (the state dict; `gbufs` grad buffers expected:
// keys 0 .. gbufs-1, one per model chunk of a virtual pipeline, each of one dtype): {state: 1-D
// tensor} and numel_unpadded. Named errors: BadDistOptimState (structure), UnsupportedDistOptim (not
// buckets_coalesced: the pre-2024 layout; grad buffers other than 0 .. gbufs-1, e.g. several dtypes),
// DistOptimBucketMismatch (a buffer not numel_unpadded long). `where` names the file / item.
Status megatron_world_buffers(const torch::PyObj* d, const std::string& where,
                              std::map<std::string, torch::TensorRef>& out, int64_t& numel, int gbuf = 0, int gbufs = 1);

struct MegatronDistribOptim {
  std::unique_ptr<torch::TorchFile> file;   // distrib_optim.pt
  std::deque<torch::TensorRef> views;       // per parameter and state: a view of a world buffer
  std::vector<MegatronOptimTensor> tensors; // refs into `views`
  std::vector<int> chunk_of;                // per tensor: the model chunk (grad buffer) it belongs to
};

// Reads `path` for the rank at pipeline stage `pp_rank` whose model parameters are `params` (one
// list per model chunk: model0 .. model{v-1} of a virtual pipeline, else one) and whose args are
// `args`. Grad buffer c is chunk c's, laid out over its parameters with the settings of (pp_rank, c)
// (dist_optim_layout.h S2: Megatron-LM buckets only chunk 0 of pipeline rank 0). Errors as
// megatron_world_buffers, plus MissingDistOptimState (no 'param' or a moment args.optimizer keeps),
// the layout's (BadDistOptimArgs, DistOptimBucketMismatch: the sizes do not add up).
Result<MegatronDistribOptim> megatron_distrib_optim(const std::string& path,
                                                    const std::vector<std::vector<MegatronModelParam>>& params,
                                                    const nlohmann::json& args, int pp_rank);

}  // namespace ckpt
