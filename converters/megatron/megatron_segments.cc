#include "converters/megatron/megatron_segments.h"

#include <algorithm>
#include <cstdio>

#include "converters/megatron/megatron_moe_args.h"
#include "converters/model/tp_split.h"

namespace ckpt {

namespace {

MegatronSegment seg(const std::string& tensor, Box box) { return MegatronSegment{tensor, std::move(box), 0}; }

// Builds a tensor from segments, computing dim 0 as the sum of the segments' rows.
MegatronTensor make(std::string name, Shape trailing, std::vector<MegatronSegment> segs) {
  int64_t rows = 0;
  for (const auto& s : segs) rows += s.rows();
  Shape shape{rows};
  shape.insert(shape.end(), trailing.begin(), trailing.end());
  return MegatronTensor{std::move(name), std::move(shape), std::move(segs)};
}

Status refuse(ErrorKind kind, const std::string& msg) {
  return Status::Error(kind == ErrorKind::kUnsupported ? "LayoutUnsupported" : "LayoutRefused", msg);
}

// The layouts Megatron cannot express (see megatron_rank_tensors).
Status check_megatron_layout(const LlamaConfig& c, const Layout& layout, int tp_rank, int pp_rank) {
  const int tp = layout.tp, pp = layout.pp;
  const int64_t L = c.num_hidden_layers, H = c.num_attention_heads, K = c.num_key_value_heads,
                I = c.intermediate_size;
  if (tp < 1 || pp < 1 || tp_rank < 0 || tp_rank >= tp || pp_rank < 0 || pp_rank >= pp)
    return Status::InvalidArgument("rank tp=" + std::to_string(tp_rank) + " pp=" + std::to_string(pp_rank) +
                                   " outside layout tp=" + std::to_string(tp) + " pp=" + std::to_string(pp));
  if (static_cast<int64_t>(layout.stage_of_layer.size()) != L)
    return refuse(ErrorKind::kInvalidArgument, "layout has " + std::to_string(layout.stage_of_layer.size()) +
                                                   " layers, the config has " + std::to_string(L));
  if (K % tp != 0)
    return refuse(ErrorKind::kUnsupported,
                  "Megatron needs tp to divide num_query_groups: tp=" + std::to_string(tp) +
                      ", num_key_value_heads=" + std::to_string(K));
  if (H % tp != 0 || I % tp != 0)
    return refuse(ErrorKind::kInvalidArgument, "tp=" + std::to_string(tp) + " must divide num_attention_heads=" +
                                                   std::to_string(H) + " and intermediate_size=" + std::to_string(I));
  if (!c.moe) return Status::Ok();
  const int64_t E = c.moe->num_experts, F = c.moe->expert_intermediate, Fs = c.moe->shared_intermediate;
  if (layout.ep < 1 || E % layout.ep != 0 || F % layout.expert_tp() != 0 || Fs % tp != 0)
    return refuse(ErrorKind::kInvalidArgument, "ep=" + std::to_string(layout.ep) + " must divide the " + std::to_string(E) +
                                                   " experts, etp=" + std::to_string(layout.expert_tp()) +
                                                   " their width " + std::to_string(F) + " and tp=" + std::to_string(tp) +
                                                   " the shared expert's " + std::to_string(Fs));
  return Status::Ok();
}

// Vocab-parallel tensor `mname` of this TP rank from canonical `hf` [V, h]: real rows, then zero
// padding up to padded_vocab / tp rows.
Result<MegatronTensor> vocab_tensor(const LlamaConfig& c, const Layout& layout, int tp_rank, const std::string& mname,
                                    const std::string& hf) {
  const int64_t V = c.vocab_size, h = c.hidden_size;
  CKPT_ASSIGN_OR_RETURN(VocabPart v, vocab_parallel_part(V, layout.padded_vocab(V), layout.tp, tp_rank));
  std::vector<MegatronSegment> segs;
  if (v.end > v.begin) segs.push_back(seg(hf, dim_slice({V, h}, 0, v.begin, v.end)));
  if (v.padding > 0) segs.push_back(MegatronSegment{"", Box{}, v.padding});
  return make(mname, {h}, std::move(segs));
}

// linear_qkv weight or bias: per query group g of this rank, [q heads of g; k_g; v_g].
MegatronTensor packed_qkv(const LlamaConfig& c, int tp, int tp_rank, const std::string& hf, const std::string& mg,
                          bool weight) {
  const int64_t H = c.num_attention_heads, K = c.num_key_value_heads, hd = c.head_dim, h = c.hidden_size;
  const int64_t groups_per_rank = K / tp, q_per_group = H / K;
  const std::string kind = weight ? "weight" : "bias";
  const Shape qs = weight ? Shape{H * hd, h} : Shape{H * hd}, ks = weight ? Shape{K * hd, h} : Shape{K * hd};
  std::vector<MegatronSegment> segs;
  for (int64_t g = tp_rank * groups_per_rank; g < (tp_rank + 1) * groups_per_rank; ++g) {
    segs.push_back(seg(hf + "self_attn.q_proj." + kind, dim_slice(qs, 0, g * q_per_group * hd, (g + 1) * q_per_group * hd)));
    segs.push_back(seg(hf + "self_attn.k_proj." + kind, dim_slice(ks, 0, g * hd, (g + 1) * hd)));
    segs.push_back(seg(hf + "self_attn.v_proj." + kind, dim_slice(ks, 0, g * hd, (g + 1) * hd)));
  }
  return make(mg + "self_attention.linear_qkv." + kind, weight ? Shape{h} : Shape{}, std::move(segs));
}

MegatronSegment expert_seg(const std::string& tensor, Shape offset, Shape extent) {
  MegatronSegment s{tensor, Box{std::move(offset), std::move(extent)}, 0};
  s.expert = true;
  return s;
}

// The MLP of MoE layer `hf` (Megatron prefix `mg`): router, the part's experts, the shared expert.
void append_moe_mlp(const LlamaConfig& c, const Layout& layout, int tp_rank, const MegatronRankPart& part,
                    const std::string& hf, const std::string& mg, std::vector<MegatronTensor>& out) {
  const MoeConfig& m = *c.moe;
  const int64_t E = m.num_experts, F = m.expert_intermediate, h = c.hidden_size;
  if (part.dense) {
    out.push_back(make(mg + "mlp.router.weight", {h}, {seg(hf + "mlp.gate.weight", Box::whole({E, h}))}));
    if (m.router_bias)
      out.push_back(make(mg + "mlp.router.expert_bias", {}, {seg(hf + "mlp.gate.e_score_correction_bias", Box::whole({E}))}));
  }
  if (part.experts) {
    const int64_t local = E / layout.ep, fp = F / layout.expert_tp(), f0 = part.etp_rank * fp;
    for (int64_t j = 0; j < local; ++j) {
      const int64_t g = part.ep_rank * local + j;
      const std::string le = mg + "mlp.experts.local_experts." + std::to_string(j) + ".";
      const std::string te = mg + "mlp.experts.linear_fc", js = std::to_string(j);
      out.push_back(make(part.te_grouped ? te + "1.weight" + js : le + "linear_fc1.weight", {h},
                         {expert_seg(hf + "mlp.experts.gate_proj.weight", {g, f0, 0}, {1, fp, h}),
                          expert_seg(hf + "mlp.experts.up_proj.weight", {g, f0, 0}, {1, fp, h})}));
      out.push_back(make(part.te_grouped ? te + "2.weight" + js : le + "linear_fc2.weight", {fp},
                         {expert_seg(hf + "mlp.experts.down_proj.weight", {g, 0, f0}, {1, h, fp})}));
    }
  }
  if (part.dense && m.shared_intermediate > 0) {
    const int64_t fs = m.shared_intermediate, sp = fs / layout.tp;
    const std::string se = hf + "mlp.shared_experts.";
    out.push_back(make(mg + "mlp.shared_experts.linear_fc1.weight", {h},
                       {seg(se + "gate_proj.weight", dim_slice({fs, h}, 0, tp_rank * sp, (tp_rank + 1) * sp)),
                        seg(se + "up_proj.weight", dim_slice({fs, h}, 0, tp_rank * sp, (tp_rank + 1) * sp))}));
    out.push_back(make(mg + "mlp.shared_experts.linear_fc2.weight", {sp},
                       {seg(se + "down_proj.weight", dim_slice({h, fs}, 1, tp_rank * sp, (tp_rank + 1) * sp))}));
    if (m.shared_gate)
      out.push_back(make(mg + "mlp.shared_experts.gate_weight", {h}, {seg(hf + "mlp.shared_expert_gate.weight", Box::whole({1, h}))}));
  }
}

// The tensors of HF layer `layer`, Megatron-local index `local` on this rank, appended to `out`.
void append_layer(const LlamaConfig& c, const Layout& layout, int tp_rank, int64_t layer, int64_t local,
                  MegatronNormNames norms, const MegatronRankPart& part, std::vector<MegatronTensor>& out) {
  const int tp = layout.tp;
  const int64_t H = c.num_attention_heads, hd = c.head_dim, h = c.hidden_size, I = c.intermediate_size;
  const std::string hf = "model.layers." + std::to_string(layer) + ".";
  const std::string mg = "decoder.layers." + std::to_string(local) + ".";
  const bool te = norms == MegatronNormNames::kTransformerEngine;
  const bool moe = c.moe && c.moe->is_moe_layer(layer);
  if (moe && !part.dense) return append_moe_mlp(c, layout, tp_rank, part, hf, mg, out);
  out.push_back(make(mg + (te ? "self_attention.linear_qkv.layer_norm_weight" : "input_layernorm.weight"), {},
                     {seg(hf + "input_layernorm.weight", Box::whole({h}))}));
  out.push_back(packed_qkv(c, tp, tp_rank, hf, mg, true));
  if (c.attention_bias || c.qkv_bias) out.push_back(packed_qkv(c, tp, tp_rank, hf, mg, false));
  // linear_proj: row-parallel, columns of o_proj; bias replicated.
  const int64_t qcols = H * hd / tp;
  out.push_back(make(mg + "self_attention.linear_proj.weight", {qcols},
                     {seg(hf + "self_attn.o_proj.weight", dim_slice({h, H * hd}, 1, tp_rank * qcols, (tp_rank + 1) * qcols))}));
  if (c.attention_bias)
    out.push_back(make(mg + "self_attention.linear_proj.bias", {}, {seg(hf + "self_attn.o_proj.bias", Box::whole({h}))}));
  out.push_back(make(mg + (te && !moe ? "mlp.linear_fc1.layer_norm_weight" : "pre_mlp_layernorm.weight"), {},
                     {seg(hf + "post_attention_layernorm.weight", Box::whole({h}))}));
  if (moe) return append_moe_mlp(c, layout, tp_rank, part, hf, mg, out);
  // linear_fc1: [gate_r; up_r].
  const int64_t ip = I / tp;
  for (const bool w : {true, false}) {
    if (!w && !c.mlp_bias) continue;
    const std::string kind = w ? "weight" : "bias";
    const Shape s = w ? Shape{I, h} : Shape{I};
    out.push_back(make(mg + "mlp.linear_fc1." + kind, w ? Shape{h} : Shape{},
                       {seg(hf + "mlp.gate_proj." + kind, dim_slice(s, 0, tp_rank * ip, (tp_rank + 1) * ip)),
                        seg(hf + "mlp.up_proj." + kind, dim_slice(s, 0, tp_rank * ip, (tp_rank + 1) * ip))}));
  }
  out.push_back(make(mg + "mlp.linear_fc2.weight", {ip},
                     {seg(hf + "mlp.down_proj.weight", dim_slice({h, I}, 1, tp_rank * ip, (tp_rank + 1) * ip))}));
  if (c.mlp_bias) out.push_back(make(mg + "mlp.linear_fc2.bias", {}, {seg(hf + "mlp.down_proj.bias", Box::whole({h}))}));
}

}  // namespace

std::string megatron_rank_dir(const Layout& layout, int tp_rank, int pp_rank, int ep_rank) {
  char buf[64];
  if (layout.pp == 1) std::snprintf(buf, sizeof buf, "mp_rank_%02d", tp_rank);
  else std::snprintf(buf, sizeof buf, "mp_rank_%02d_%03d", tp_rank, pp_rank);
  std::string dir = buf;
  if (layout.ep > 1) {
    std::snprintf(buf, sizeof buf, "_%03d", ep_rank);
    dir += buf;
  }
  return dir;
}

Result<std::vector<MegatronTensor>> megatron_rank_tensors(const LlamaConfig& c, const Layout& layout_in, int tp_rank,
                                                          int pp_rank, MegatronNormNames norms,
                                                          const MegatronRankPart& part) {
  CKPT_ASSIGN_OR_RETURN(const Layout layout, layout_in.as_symmetric("the Megatron layout"));
  CKPT_RETURN_IF_ERROR(check_megatron_layout(c, layout, tp_rank, pp_rank));
  std::vector<MegatronTensor> out;
  if (pp_rank == 0 && part.dense) {
    CKPT_ASSIGN_OR_RETURN(auto t, vocab_tensor(c, layout, tp_rank, "embedding.word_embeddings.weight",
                                               "model.embed_tokens.weight"));
    out.push_back(std::move(t));
  }
  int64_t local = 0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    if (layout.stage_of_layer[i] == pp_rank) append_layer(c, layout, tp_rank, i, local++, norms, part, out);
  if (local == 0)
    return refuse(ErrorKind::kInvalidArgument, "pipeline stage " + std::to_string(pp_rank) + " holds no layer");
  if (pp_rank == layout.pp - 1 && part.dense) {
    out.push_back(make("decoder.final_layernorm.weight", {}, {seg("model.norm.weight", Box::whole({c.hidden_size}))}));
    // The output head: lm_head, or the tied embedding when it lives on another stage.
    if (!c.tie_word_embeddings || layout.pp > 1) {
      const char* hf = c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
      CKPT_ASSIGN_OR_RETURN(auto t, vocab_tensor(c, layout, tp_rank, "output_layer.weight", hf));
      out.push_back(std::move(t));
    }
  }
  return out;
}

nlohmann::json megatron_args(const LlamaConfig& c, const Layout& layout) {
  nlohmann::json j;
  j["tensor_model_parallel_size"] = layout.tp;
  j["pipeline_model_parallel_size"] = layout.pp;
  j["tp"] = layout.tp;
  j["pp"] = layout.pp;
  j["num_layers"] = c.num_hidden_layers;
  std::vector<int> per_stage;
  for (int s = 0; s < layout.pp; ++s)
    per_stage.push_back(static_cast<int>(std::count(layout.stage_of_layer.begin(), layout.stage_of_layer.end(), s)));
  j["layers_per_stage"] = per_stage;
  j["hidden_size"] = c.hidden_size;
  j["hidden"] = c.hidden_size;
  j["ffn_hidden_size"] = c.intermediate_size;
  j["num_attention_heads"] = c.num_attention_heads;
  j["heads"] = c.num_attention_heads;
  j["group_query_attention"] = c.num_key_value_heads != c.num_attention_heads;
  j["num_query_groups"] = c.num_key_value_heads;
  j["kv_channels"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["padded_vocab_size"] = layout.padded_vocab(c.vocab_size);
  j["make_vocab_size_divisible_by"] = layout.vocab_divisor;
  j["swiglu"] = true;
  j["untie_embeddings_and_output_weights"] = !c.tie_word_embeddings;
  j["add_qkv_bias"] = c.attention_bias || c.qkv_bias;
  j["add_bias_linear"] = c.attention_bias || c.mlp_bias;
  j["normalization"] = "RMSNorm";
  j["norm_epsilon"] = c.rms_norm_eps;
  j["rotary_base"] = c.rope_theta;
  j["position_embedding_type"] = "rope";
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["checkpoint_version"] = 3.0;
  megatron_moe_args(c, layout, j);
  return j;
}

}  // namespace ckpt
