#include "converters/hf/hf_moe_names.h"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "converters/model/tp_split.h"

namespace ckpt {

namespace {

const std::string kMoeMlp = ".mlp.";
// The scales beside a quantized `X.weight` (converters/quant/quant_scheme.h): block FP8, per tensor.
const char* const kMoeScaleSuffixes[] = {"_scale_inv", "_scale"};

// Where a canonical name's MLP part starts: "model.layers.3.mlp." -> {prefix "model.layers.3.",
// suffix after "mlp."}; false for tensors outside an MoE layer's MLP, and for gpt-oss, whose HF
// names are the canonical ones (moe_config.h).
bool moe_mlp_part(const LlamaConfig& c, const std::string& name, std::string* prefix, std::string* suffix) {
  const int64_t layer = llama_layer_of(name);
  if (layer < 0 || !c.moe || !c.moe->is_moe_layer(layer) || c.family == ModelFamily::kGptOss) return false;
  const auto at = name.find(kMoeMlp);
  if (at == std::string::npos) return false;
  *prefix = name.substr(0, at + 1);
  *suffix = name.substr(at + kMoeMlp.size());
  return true;
}

// The HF per-expert ("legacy") name of expert `e` of canonical `experts.<proj>.weight`.
std::string legacy_expert_name(const LlamaConfig& c, const std::string& prefix, const std::string& proj, int64_t e) {
  if (c.family == ModelFamily::kMixtral) {
    const char* w = proj == "gate_proj" ? "w1" : proj == "up_proj" ? "w3" : "w2";
    return prefix + "block_sparse_moe.experts." + std::to_string(e) + "." + w + ".weight";
  }
  return prefix + "mlp.experts." + std::to_string(e) + "." + proj + ".weight";
}

// The HF name of a canonical MoE-layer tensor that is one tensor in HF too (router, shared expert).
std::string hf_single_name(const LlamaConfig& c, const std::string& prefix, const std::string& suffix, bool legacy) {
  if (suffix == "gate.weight" && c.family == ModelFamily::kMixtral && legacy) return prefix + "block_sparse_moe.gate.weight";
  if (suffix.starts_with("shared_experts.") && c.family == ModelFamily::kQwen2Moe)
    return prefix + "mlp.shared_expert." + suffix.substr(std::string("shared_experts.").size());
  return prefix + "mlp." + suffix;
}

Status moe_missing(const std::string& name, const Shape& shape, const std::string& why) {
  return Status::Error("MissingTensor", "the source has no tensor '" + name + "' " + shape_to_string(shape) + " (" + why + ")")
      .with_tensor(name);
}

Status moe_shape_mismatch(const std::string& name, const Shape& got, const Shape& want) {
  return Status::Error("ShapeMismatch", "tensor '" + name + "' has shape " + shape_to_string(got) + ", the config expects " +
                                            shape_to_string(want))
      .with_tensor(name);
}

class ImportBuilder {
 public:
  ImportBuilder(const LlamaConfig& c, const std::vector<TensorMeta>& src) : c_(c) {
    for (const auto& t : src) src_[t.name] = &t;
  }

  // The canonical tensor `want` from the whole HF tensor `name`; a renamed quantized weight's scales
  // (`name_scale_inv`, `name_scale`) follow it under the canonical name.
  Status whole(const TensorMeta& want, const std::string& name, const std::string& why) {
    const TensorMeta* s = find(name);
    if (!s) return moe_missing(name, want.shape, why);
    if (s->shape != want.shape) return moe_shape_mismatch(name, s->shape, want.shape);
    add(want, s->dtype, {TensorAlias{want.name, Box::whole(want.shape), name, Box::whole(want.shape)}}, {name});
    for (const char* suf : kMoeScaleSuffixes)
      if (const TensorMeta* sc = find(name + suf); sc && name != want.name)
        add(TensorMeta{want.name + suf, sc->dtype, sc->shape}, sc->dtype,
            {TensorAlias{want.name + suf, Box::whole(sc->shape), sc->name, Box::whole(sc->shape)}}, {sc->name});
    return Status::Ok();
  }

  // A stacked expert tensor [E, ...] from the fused HF tensors or the per-expert ones.
  Status experts(const TensorMeta& want, const std::string& prefix, const std::string& proj) {
    const Shape& w = want.shape;
    const int64_t E = w[0];
    if (find(want.name)) return whole(want, want.name, "stacked experts");  // a source already in the canonical view
    if (const TensorMeta* gu = find(prefix + "mlp.experts.gate_up_proj"); gu && proj != "down_proj") {
      const Shape fused{E, 2 * w[1], w[2]};
      if (gu->shape != fused) return moe_shape_mismatch(gu->name, gu->shape, fused);
      if (find(gu->name + kMoeScaleSuffixes[0]))  // its blocks may straddle gate and up: not split here
        return Status::Error("QuantUnsupported", "fused FP8 experts '" + gu->name + "' with '" + gu->name + kMoeScaleSuffixes[0] +
                                                     "': ckpt reads block-FP8 experts per expert (experts.{e}.gate_proj.weight)")
            .with_tensor(gu->name);
      const int64_t half = proj == "gate_proj" ? 0 : 1;
      add(want, gu->dtype, {TensorAlias{want.name, Box::whole(w), gu->name, dim_slice(fused, 1, half * w[1], (half + 1) * w[1])}},
          {gu->name});
      return Status::Ok();
    }
    if (proj == "down_proj" && find(prefix + "mlp.experts.down_proj"))
      return whole(want, prefix + "mlp.experts.down_proj", "fused experts");
    std::vector<TensorAlias> aliases;
    std::vector<std::string> used;
    const Shape one{w[1], w[2]};
    std::optional<DType> dt;
    for (int64_t e = 0; e < E; ++e) {
      const std::string name = legacy_expert_name(c_, prefix, proj, e);
      const TensorMeta* s = find(name);
      if (!s) return moe_missing(name, one, "expert " + std::to_string(e) + " of " + std::to_string(E));
      if (s->shape != one) return moe_shape_mismatch(name, s->shape, one);
      if (dt && *dt != s->dtype)
        return Status::Error("MixedDtypes", "tensor '" + name + "' is " + std::string(dtype_name(s->dtype)) + " but expert 0 of '" +
                                                want.name + "' is " + std::string(dtype_name(*dt)))
            .with_tensor(name);
      dt = s->dtype;
      aliases.push_back(TensorAlias{want.name, dim_slice(w, 0, e, e + 1), name, Box::whole(one)});
      used.push_back(name);
    }
    add(want, *dt, std::move(aliases), std::move(used));
    return expert_scales(want, prefix, proj);
  }

  // Block-FP8 experts as DeepSeek-V3 and Qwen3-FP8 ship them: `experts.{e}.<proj>.weight_scale_inv`
  // per expert, stacked as `experts.<proj>.weight_scale_inv` [E, ..] beside the stacked weight
  // (converters/quant reads the pair). Either every expert has scales of one shape and dtype or none.
  Status expert_scales(const TensorMeta& want, const std::string& prefix, const std::string& proj) {
    const int64_t E = want.shape[0];
    const TensorMeta* first = nullptr;
    for (int64_t e = 0; e < E && !first; ++e) first = find(legacy_expert_name(c_, prefix, proj, e) + kMoeScaleSuffixes[0]);
    if (!first) return Status::Ok();
    Shape stacked{E};
    stacked.insert(stacked.end(), first->shape.begin(), first->shape.end());
    std::vector<TensorAlias> aliases;
    std::vector<std::string> used;
    for (int64_t e = 0; e < E; ++e) {
      const std::string name = legacy_expert_name(c_, prefix, proj, e) + kMoeScaleSuffixes[0];
      const TensorMeta* s = find(name);
      if (!s) return moe_missing(name, first->shape, "the scales of expert " + std::to_string(e) + ": " + first->name + " has them");
      if (s->shape != first->shape) return moe_shape_mismatch(name, s->shape, first->shape);
      if (s->dtype != first->dtype)
        return Status::Error("MixedDtypes", "scales '" + name + "' are " + std::string(dtype_name(s->dtype)) + " but '" + first->name +
                                                "' are " + std::string(dtype_name(first->dtype)))
            .with_tensor(name);
      aliases.push_back(TensorAlias{want.name + kMoeScaleSuffixes[0], dim_slice(stacked, 0, e, e + 1), name, Box::whole(s->shape)});
      used.push_back(name);
    }
    add(TensorMeta{want.name + kMoeScaleSuffixes[0], first->dtype, stacked}, first->dtype, std::move(aliases), std::move(used));
    return Status::Ok();
  }

  HfAliases take() { return std::move(out_); }

 private:
  const TensorMeta* find(const std::string& name) const {
    auto it = src_.find(name);
    return it == src_.end() ? nullptr : it->second;
  }
  void add(const TensorMeta& want, DType dt, std::vector<TensorAlias> aliases, std::vector<std::string> used) {
    out_.tensors.push_back(TensorMeta{want.name, dt, want.shape});
    for (auto& a : aliases) out_.aliases.push_back(std::move(a));
    out_.used.insert(used.begin(), used.end());
  }

  const LlamaConfig& c_;
  std::map<std::string, const TensorMeta*> src_;
  HfAliases out_;
};

}  // namespace

Result<HfAliases> hf_moe_import_aliases(const LlamaConfig& c, const std::vector<TensorMeta>& canonical,
                                        const std::vector<TensorMeta>& src) {
  ImportBuilder b(c, src);
  bool has_block_sparse = false;
  for (const auto& t : src) has_block_sparse = has_block_sparse || t.name.find(".block_sparse_moe.") != std::string::npos;
  for (const TensorMeta& want : canonical) {
    std::string prefix, suffix;
    if (!moe_mlp_part(c, want.name, &prefix, &suffix)) {
      CKPT_RETURN_IF_ERROR(b.whole(want, want.name, "required by config.json"));
    } else if (suffix.starts_with("experts.")) {
      const std::string proj = suffix.substr(8, suffix.size() - 8 - 7);  // experts.<proj>.weight
      CKPT_RETURN_IF_ERROR(b.experts(want, prefix, proj));
    } else {
      const bool canonical = std::any_of(src.begin(), src.end(), [&](const TensorMeta& t) { return t.name == want.name; });
      CKPT_RETURN_IF_ERROR(b.whole(want, canonical ? want.name : hf_single_name(c, prefix, suffix, has_block_sparse),
                                   "required by config.json"));
    }
  }
  return b.take();
}

Result<std::unique_ptr<TensorSource>> hf_moe_canonical_source(std::unique_ptr<TensorSource> src) {
  const nlohmann::json& md = src->metadata();
  if (!md.is_object() || !md.contains("model_config")) return src;
  auto cfg = LlamaConfig::from_json(md["model_config"]);
  if (!cfg.ok() || !cfg->moe || cfg->family == ModelFamily::kGptOss) return src;  // gpt-oss: HF names are canonical
  auto al = hf_moe_import_aliases(*cfg, llama_model_tensors(*cfg, cfg->dtype), src->tensors());
  if (!al.ok()) return src;
  std::vector<TensorMeta> tensors = std::move(al->tensors);
  for (const auto& t : src->tensors())  // tensors the aliases do not read stay as they are (inv_freq, ...)
    if (!al->used.count(t.name)) {
      tensors.push_back(t);
      al->aliases.push_back(TensorAlias{t.name, Box::whole(t.shape), t.name, Box::whole(t.shape)});
    }
  return make_alias_view(std::move(src), std::move(tensors), std::move(al->aliases));
}

HfAliases hf_moe_export_aliases(const LlamaConfig& c, const std::vector<TensorMeta>& canonical) {
  HfAliases out;
  for (const TensorMeta& t : canonical) {
    // A quantized weight's scales kept as stored (--keep-quantized) go where the weight goes.
    std::string base = t.name, scale;
    for (const char* suf : kMoeScaleSuffixes)
      if (scale.empty() && t.name.ends_with(std::string(".weight") + suf)) {
        scale = suf;
        base = t.name.substr(0, t.name.size() - scale.size());
      }
    std::string prefix, suffix;
    if (!moe_mlp_part(c, base, &prefix, &suffix) || !suffix.starts_with("experts.")) {
      const std::string name = moe_mlp_part(c, base, &prefix, &suffix) ? hf_single_name(c, prefix, suffix, true) + scale : t.name;
      out.tensors.push_back(TensorMeta{name, t.dtype, t.shape});
      out.aliases.push_back(TensorAlias{name, Box::whole(t.shape), t.name, Box::whole(t.shape)});
      out.used.insert(t.name);
      continue;
    }
    const std::string proj = suffix.substr(8, suffix.size() - 8 - 7);
    const Shape one(t.shape.begin() + 1, t.shape.end());
    for (int64_t e = 0; e < t.shape[0]; ++e) {
      const std::string name = legacy_expert_name(c, prefix, proj, e) + scale;
      out.tensors.push_back(TensorMeta{name, t.dtype, one});
      out.aliases.push_back(TensorAlias{name, Box::whole(one), t.name, dim_slice(t.shape, 0, e, e + 1)});
    }
    out.used.insert(t.name);
  }
  return out;
}

}  // namespace ckpt
