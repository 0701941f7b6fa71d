#include "converters/megatron/megatron_vpp.h"

#include <algorithm>

namespace ckpt {

Result<int64_t> megatron_vpp_chunk_layers(int64_t num_layers, int pp, int vpp, const std::string& what) {
  if (num_layers < 1 || pp < 1 || vpp < 1)
    return Status::InvalidArgument(what + ": num_layers = " + std::to_string(num_layers) + ", pp = " +
                                   std::to_string(pp) + ", vpp = " + std::to_string(vpp) + " must be >= 1");
  const int64_t chunks = int64_t{pp} * vpp;
  if (num_layers % chunks != 0)
    return Status::Error("MegatronVppLayersNotDivisible",
                         what + ": " + std::to_string(num_layers) + " layers do not divide into pp * vpp = " +
                             std::to_string(pp) + " * " + std::to_string(vpp) + " = " + std::to_string(chunks) +
                             " equal chunks (Megatron's interleaved schedule needs num_layers % (pp * vpp) == 0)");
  return num_layers / chunks;
}

Result<VppChunk> megatron_vpp_chunk(int64_t num_layers, int pp, int vpp, int pp_rank, int chunk, const std::string& what) {
  CKPT_ASSIGN_OR_RETURN(const int64_t n, megatron_vpp_chunk_layers(num_layers, pp, vpp, what));
  if (pp_rank < 0 || pp_rank >= pp || chunk < 0 || chunk >= vpp)
    return Status::InvalidArgument(what + ": chunk " + std::to_string(chunk) + " of pipeline rank " +
                                   std::to_string(pp_rank) + " outside pp = " + std::to_string(pp) + ", vpp = " +
                                   std::to_string(vpp));
  // get_transformer_layer_offset: vp_stage * (num_layers / vpp) + pipeline_rank * layers per chunk.
  return VppChunk{pp_rank, chunk, chunk * (num_layers / vpp) + pp_rank * n, n};
}

Result<Layout> megatron_vpp_layout(const Layout& layout, int vpp, const std::string& what) {
  const int64_t L = static_cast<int64_t>(layout.stage_of_layer.size());
  CKPT_ASSIGN_OR_RETURN(const int64_t n, megatron_vpp_chunk_layers(L, layout.pp, vpp, what));
  if (vpp > 1 && layout.pp < 2)
    return Status::Error("MegatronVppNeedsPipeline",
                         what + ": a virtual pipeline of " + std::to_string(vpp) + " chunks needs pp > 1 "
                         "(Megatron-LM's arguments.py: the interleaved schedule runs over several pipeline ranks)");
  for (int s = 0; s < layout.pp; ++s)
    if (std::count(layout.stage_of_layer.begin(), layout.stage_of_layer.end(), s) != n * vpp)
      return Status::Error("MegatronVppLayersNotDivisible",
                           what + ": pipeline stage " + std::to_string(s) + " holds " +
                               std::to_string(std::count(layout.stage_of_layer.begin(), layout.stage_of_layer.end(), s)) +
                               " layers; an interleaved pipeline needs every stage to hold " + std::to_string(n * vpp) +
                               " (an uneven split with a virtual pipeline is not handled)");
  CKPT_ASSIGN_OR_RETURN(Layout v, Layout::make(layout.tp, layout.pp * vpp, layout.dp, layout.zero, static_cast<int>(L), {}));
  v.vocab_divisor = layout.vocab_divisor;
  return v;
}

nlohmann::json megatron_vpp_args(nlohmann::json args, int vpp) {
  if (vpp <= 1) return args;
  args["virtual_pipeline_model_parallel_size"] = vpp;
  const int64_t layers = args.value("num_layers", int64_t{0}), pp = args.value("pipeline_model_parallel_size", int64_t{1});
  if (pp >= 1 && layers % (pp * vpp) == 0) args["num_layers_per_virtual_pipeline_stage"] = layers / (pp * vpp);
  args.erase("layers_per_stage");
  return args;
}

}  // namespace ckpt
