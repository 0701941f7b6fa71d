#include "converters/megatron/dist_optim_group.h"

#include <map>

namespace ckpt {

namespace dist_optim_group_detail {

// The local spec's registration order of one stage's parameters (GPTModel: embedding, then per
// layer TransformerLayer's input_layernorm, self_attention (Attention registers linear_proj before
// SelfAttention's linear_qkv), pre_mlp_layernorm, mlp (linear_fc1, linear_fc2); final_layernorm,
// output_layer). Every rank tensor must be placed, else UnsupportedDistOptim.
Result<std::vector<const MegatronTensor*>> registration_order(const std::vector<MegatronTensor>& ts,
                                                               const std::string& dir) {
  std::map<std::string, const MegatronTensor*> by;
  for (const auto& t : ts) by[t.name] = &t;
  std::vector<std::string> order{"embedding.word_embeddings.weight"};
  for (int64_t l = 0;; ++l) {
    const std::string p = "decoder.layers." + std::to_string(l) + ".";
    if (!by.count(p + "input_layernorm.weight")) break;
    for (const char* n : {"input_layernorm.weight", "self_attention.linear_proj.weight",
                          "self_attention.linear_qkv.weight", "pre_mlp_layernorm.weight", "mlp.linear_fc1.weight",
                          "mlp.linear_fc2.weight"})
      order.push_back(p + n);
  }
  order.push_back("decoder.final_layernorm.weight");
  order.push_back("output_layer.weight");
  std::vector<const MegatronTensor*> out;
  for (const auto& n : order)
    if (auto it = by.find(n); it != by.end()) out.push_back(it->second);
  if (out.size() != ts.size())
    return Status::Error("UnsupportedDistOptim", "'" + dir +
                                                     "': the model has parameters outside the local spec's known "
                                                     "registration order: the bucket layout cannot be derived")
        .with_file(dir);
  return out;
}

}  // namespace dist_optim_group_detail

Result<DistOptimGroup> dist_optim_group(const LlamaConfig& cfg, const Layout& saved, const nlohmann::json& args,
                                        const std::string& dir, int tp_r, int pp_r, int vpp) {
  using namespace dist_optim_group_detail;
  DistOptimGroup out;
  CKPT_ASSIGN_OR_RETURN(out.tensors, megatron_rank_tensors(cfg, saved, tp_r, pp_r, MegatronNormNames::kLocal));
  CKPT_ASSIGN_OR_RETURN(auto order, registration_order(out.tensors, dir));
  std::vector<DistOptimParam> params;
  const bool shared = cfg.tie_word_embeddings && saved.pp > 1;
  for (const MegatronTensor* t : order) {
    int64_t n = 1;
    for (int64_t d : t->shape) n *= d;
    const bool emb = t->name == "embedding.word_embeddings.weight" && pp_r != saved.pp - 1;
    const bool outl = t->name == "output_layer.weight" && pp_r != 0;
    params.push_back(DistOptimParam{t->name, n, shared && (emb || outl)});
  }
  const int pp = vpp > 1 ? saved.pp / vpp : saved.pp;  // the real pipeline
  CKPT_ASSIGN_OR_RETURN(DistOptimSettings s, dist_optim_settings(args, pp_r % pp, pp_r / pp, dir));
  CKPT_ASSIGN_OR_RETURN(out.layout, dist_optim_layout(params, s));
  for (size_t k = 0; k < out.layout.params.size(); ++k) out.slot_tensor.push_back(order[order.size() - 1 - k]);
  return out;
}

std::string dist_optim_dtype_key(const std::string& param_dtype, const std::string& grad_dtype) {
  return "(" + param_dtype + ", " + grad_dtype + ")";
}

}  // namespace ckpt
