// profile_tensors: a profile's global tensors as segments of canonical tensors (converters/profile/profile.h).
#include <algorithm>
#include <map>
#include <set>

#include "converters/model/tp_split.h"
#include "converters/profile/profile.h"
#include "converters/profile/profile_kinds.h"

namespace ckpt {

namespace profile_tensors_detail {

bool name_ends(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The profile kind of canonical model tensor `name` before packing ("q", "o_bias", "embed", ...).
std::string canonical_kind(const std::string& name) {
  if (name == "model.embed_tokens.weight") return "embed";
  if (name == "model.norm.weight") return "final_norm";
  if (name == "lm_head.weight") return "lm_head";
  if (name_ends(name, ".input_layernorm.weight")) return "input_norm";
  if (name_ends(name, ".post_attention_layernorm.weight")) return "post_norm";
  static const std::pair<const char*, const char*> kProj[] = {
      {"self_attn.q_proj.", "q"}, {"self_attn.k_proj.", "k"},  {"self_attn.v_proj.", "v"},   {"self_attn.o_proj.", "o"},
      {"mlp.gate_proj.", "gate"}, {"mlp.up_proj.", "up"},      {"mlp.down_proj.", "down"}};
  for (const auto& [part, kind] : kProj) {
    if (name_ends(name, std::string(part) + "weight")) return kind;
    if (name_ends(name, std::string(part) + "bias")) return std::string(kind) + "_bias";
  }
  return "";
}

// The kind of the profile tensor holding a canonical kind under the profile's packings.
std::string packed_kind(const Profile& p, const std::string& kind) {
  const bool bias = name_ends(kind, "_bias");
  const std::string base = bias ? kind.substr(0, kind.size() - 5) : kind;
  std::string out = base;
  if (p.qkv != QkvPacking::kSeparate && (base == "q" || base == "k" || base == "v")) out = "qkv";
  if (p.mlp != MlpPacking::kSeparate && (base == "gate" || base == "up")) out = "gate_up";
  return bias ? out + "_bias" : out;
}

std::string layer_name(const std::string& pattern, int64_t layer) {
  std::string s = pattern;
  if (auto pos = s.find("{i}"); pos != std::string::npos) s.replace(pos, 3, std::to_string(layer));
  return s;
}

ProfileSegment rows_of(const std::string& canonical, const Shape& shape, int64_t begin, int64_t end) {
  return ProfileSegment{canonical, dim_slice(shape, 0, begin, end), 0};
}

struct TensorBuilder {
  const Profile& p;
  const LlamaConfig& c;
  int tp;
  const std::map<std::string, TensorMeta>& model;  // canonical model tensors (source dtypes)

  const TensorMeta& meta(const std::string& prefix, const char* proj, const std::string& kind) const {
    return model.at(prefix + proj + kind);
  }

  // Segments of the packed qkv (weight or bias) of layer prefix `pre` ("model.layers.3.").
  std::vector<ProfileSegment> qkv_segments(const std::string& pre, const std::string& kind) const {
    const TensorMeta &q = meta(pre, "self_attn.q_proj.", kind), &k = meta(pre, "self_attn.k_proj.", kind),
                     &v = meta(pre, "self_attn.v_proj.", kind);
    const int64_t H = c.num_attention_heads, K = c.num_key_value_heads, hd = c.head_dim;
    std::vector<ProfileSegment> s;
    auto triple = [&](int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
      s.push_back(rows_of(q.name, q.shape, q0, q1));
      s.push_back(rows_of(k.name, k.shape, k0, k1));
      s.push_back(rows_of(v.name, v.shape, k0, k1));
    };
    switch (p.qkv) {
      case QkvPacking::kMegatronGroups:
        for (int64_t g = 0, G = H / K; g < K; ++g) triple(g * G * hd, (g + 1) * G * hd, g * hd, (g + 1) * hd);
        break;
      case QkvPacking::kLibaiHeads:
        for (int64_t h = 0; h < H; ++h) triple(h * hd, (h + 1) * hd, h * hd, (h + 1) * hd);
        break;
      case QkvPacking::kFusedWhole: triple(0, H * hd, 0, K * hd); break;
      case QkvPacking::kFusedPerTp:
        for (int64_t r = 0; r < tp; ++r)
          triple(r * H * hd / tp, (r + 1) * H * hd / tp, r * K * hd / tp, (r + 1) * K * hd / tp);
        break;
      case QkvPacking::kSeparate: break;
    }
    return s;
  }

  std::vector<ProfileSegment> gate_up_segments(const std::string& pre, const std::string& kind) const {
    const TensorMeta &g = meta(pre, "mlp.gate_proj.", kind), &u = meta(pre, "mlp.up_proj.", kind);
    const int64_t I = c.intermediate_size;
    if (p.mlp == MlpPacking::kFusedWhole) return {rows_of(g.name, g.shape, 0, I), rows_of(u.name, u.shape, 0, I)};
    std::vector<ProfileSegment> s;
    for (int64_t r = 0; r < tp; ++r) {
      s.push_back(rows_of(g.name, g.shape, r * I / tp, (r + 1) * I / tp));
      s.push_back(rows_of(u.name, u.shape, r * I / tp, (r + 1) * I / tp));
    }
    return s;
  }

  // The profile tensor of packed kind `pk` that canonical tensor `t` (of layer `layer`) belongs to.
  ProfileTensor build(const TensorMeta& t, const std::string& pk, int64_t layer) const {
    ProfileTensor out;
    out.name = layer_name(p.pattern(pk), layer);
    const std::string pre = layer >= 0 ? "model.layers." + std::to_string(layer) + "." : "";
    const std::string suffix = name_ends(pk, "_bias") ? "bias" : "weight";
    if (pk == "qkv" || pk == "qkv_bias") out.segments = qkv_segments(pre, suffix);
    else if (pk == "gate_up" || pk == "gate_up_bias") out.segments = gate_up_segments(pre, suffix);
    else out.segments = {ProfileSegment{t.name, Box::whole(t.shape), 0}};
    if (pk == "embed" || pk == "lm_head") {
      out.cls = TensorClass::kEmbedding;
      const int64_t padded = p.vocab.padded(t.shape[0], tp);
      if (padded > t.shape[0]) out.segments.push_back(ProfileSegment{"", Box{}, padded - t.shape[0]});
    } else if (pk == "input_norm" || pk == "post_norm" || pk == "final_norm") {
      out.cls = TensorClass::kNorm;
    }
    int64_t rows = 0;
    for (const auto& s : out.segments) rows += s.rows();
    out.shape = t.shape;
    if (!out.shape.empty()) out.shape[0] = rows;
    out.transposed = p.orientation == Orientation::kInOut && out.shape.size() == 2 && pk != "embed";
    if (out.transposed) std::swap(out.shape[0], out.shape[1]);
    out.dtype = p.stored_dtype(out.cls, t.dtype);
    return out;
  }
};

Status unsupported(const Profile& p, const std::string& rule) {
  return Status::Error("ProfileUnsupported", "profile '" + p.name + "' cannot express this model: " + rule);
}

// The model and tp the profile's packings and names can express.
Status check_model(const Profile& p, const LlamaConfig& c, int tp) {
  const int64_t H = c.num_attention_heads, K = c.num_key_value_heads, I = c.intermediate_size;
  const std::string ts = std::to_string(tp);
  if (tp < 1) return Status::InvalidArgument("profile_tensors: tp=" + ts + ", expected >= 1");
  if (H < 1 || K < 1 || H % K != 0 || c.head_dim < 1)
    return unsupported(p, "num_attention_heads=" + std::to_string(H) + " and num_key_value_heads=" + std::to_string(K) +
                              " (heads must be a positive multiple of the KV heads)");
  if (p.qkv == QkvPacking::kLibaiHeads && K != H)
    return unsupported(p, "qkv_packing libai-heads interleaves q, k and v per attention head and needs "
                          "num_key_value_heads == num_attention_heads, found " + std::to_string(K) + " and " +
                              std::to_string(H) + " (GQA)");
  if (p.qkv == QkvPacking::kFusedPerTp && (H % tp != 0 || K % tp != 0))
    return unsupported(p, "qkv_packing fused-per-tp needs tp to divide num_attention_heads=" + std::to_string(H) +
                              " and num_key_value_heads=" + std::to_string(K) + ", found tp=" + ts);
  if (p.mlp == MlpPacking::kFusedPerTp && I % tp != 0)
    return unsupported(p, "mlp_packing fused-per-tp needs tp to divide intermediate_size=" + std::to_string(I) +
                              ", found tp=" + ts);
  std::vector<std::string> need;
  if (c.attention_bias) need = profile_kinds::attention_bias_kinds(p.qkv);
  if (c.mlp_bias)
    for (auto& k : profile_kinds::mlp_bias_kinds(p.mlp)) need.push_back(k);
  for (const auto& k : need)
    if (p.pattern(k).empty())
      return Status::Error("ProfileIncompleteNaming", "profile '" + p.name + "': field 'names." + k +
                                                          "': expected a name (the model has " +
                                                          (name_ends(k, "_bias") && (k.starts_with("gate") ||
                                                                                     k.starts_with("up") ||
                                                                                     k.starts_with("down"))
                                                               ? "mlp_bias"
                                                               : "attention_bias") +
                                                          "), found none");
  return Status::Ok();
}

// "optimizer.<kind>.<param>" -> (kind, param); false when `name` is not of that form.
bool split_optimizer_name(const std::string& name, std::string* kind, std::string* param) {
  if (!name.starts_with("optimizer.")) return false;
  const size_t dot = name.find('.', 10);
  if (dot == std::string::npos || dot == 10) return false;
  *kind = name.substr(10, dot - 10);
  *param = name.substr(dot + 1);
  return true;
}

// Optimizer tensors of `model_tensors` for the optimizer entries of `canonical`.
Result<std::vector<ProfileTensor>> optimizer_tensors(const Profile& p, const std::vector<ProfileTensor>& model_tensors,
                                                     const std::map<std::string, size_t>& holder,
                                                     const std::vector<TensorMeta>& canonical) {
  std::set<std::string> present;
  for (const auto& t : canonical) present.insert(t.name);
  std::set<std::pair<std::string, size_t>> done;
  std::vector<ProfileTensor> out;
  for (const auto& t : canonical) {
    std::string kind, param;
    if (!split_optimizer_name(t.name, &kind, &param)) continue;
    auto h = holder.find(param);
    if (h == holder.end())
      return Status::Error("UnknownTensor", "optimizer tensor '" + t.name + "' is the state of '" + param +
                                                "', which is not a tensor of this LLaMA model")
          .with_tensor(t.name);
    if (!done.insert({kind, h->second}).second) continue;
    ProfileTensor o = model_tensors[h->second];
    const std::string prefix = "optimizer." + kind + ".";
    o.name = prefix + o.name;
    o.cls = TensorClass::kOptimizer;
    o.dtype = p.stored_dtype(TensorClass::kOptimizer, t.dtype);
    for (auto& s : o.segments) {
      if (s.canonical.empty()) continue;
      s.canonical = prefix + s.canonical;
      if (!present.count(s.canonical))
        return Status::Error("ProfileUnsupported", "profile '" + p.name + "' packs optimizer tensor '" + t.name +
                                                       "' into '" + o.name + "' together with '" + s.canonical +
                                                       "', which the source does not hold")
            .with_tensor(t.name);
    }
    out.push_back(std::move(o));
  }
  return out;
}

}  // namespace profile_tensors_detail

Result<std::vector<ProfileTensor>> profile_tensors(const Profile& p, const LlamaConfig& config,
                                                   const std::vector<TensorMeta>& canonical, int tp) {
  using namespace profile_tensors_detail;
  CKPT_RETURN_IF_ERROR(config.require_dense("profile '" + p.name + "'"));
  CKPT_RETURN_IF_ERROR(check_model(p, config, tp));
  std::map<std::string, TensorMeta> model;
  std::vector<TensorMeta> order = llama_model_tensors(config, config.dtype);
  for (const auto& t : order) model[t.name] = t;
  for (const auto& t : canonical) {
    std::string kind, param;
    if (split_optimizer_name(t.name, &kind, &param)) continue;
    auto it = model.find(t.name);
    if (it == model.end())
      return Status::Error("UnknownTensor", "tensor '" + t.name + "' is not a tensor of this LLaMA model")
          .with_tensor(t.name);
    if (it->second.shape != t.shape)
      return Status::Error("ShapeMismatch", "tensor '" + t.name + "' has shape " + shape_to_string(t.shape) +
                                                ", the config expects " + shape_to_string(it->second.shape))
          .with_tensor(t.name);
    it->second.dtype = t.dtype;
  }
  const TensorBuilder b{p, config, tp, model};
  std::vector<ProfileTensor> out;
  std::map<std::string, size_t> holder;  // canonical model tensor -> index in `out`
  std::map<std::pair<std::string, int64_t>, size_t> emitted;
  for (const auto& t : order) {
    const std::string pk = packed_kind(p, canonical_kind(t.name));
    const int64_t layer = llama_layer_of(t.name);
    auto [it, fresh] = emitted.emplace(std::make_pair(pk, layer), out.size());
    if (fresh) out.push_back(b.build(model.at(t.name), pk, layer));
    holder[t.name] = it->second;
  }
  CKPT_ASSIGN_OR_RETURN(auto opt, optimizer_tensors(p, out, holder, canonical));
  for (auto& o : opt) out.push_back(std::move(o));
  return out;
}

}  // namespace ckpt
