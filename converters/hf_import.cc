#include "converters/hf_import.h"

#include <map>
#include <set>

#include "converters/hf_export.h"
#include "formats/checked.h"
#include "reshard/executor.h"
#include "reshard/layout.h"

namespace ckpt {

Result<HfImportPlan> plan_hf_import(const TensorSource& src, const HfImportOptions& opts) {
  const auto& md = src.metadata();
  if (!md.is_object() || !md.contains("model_config"))
    return Status::NotFound("'" + src.describe() + "' has no config.json: a HuggingFace LLaMA directory needs one");
  HfImportPlan plan;
  CKPT_ASSIGN_OR_RETURN(plan.config, LlamaConfig::from_json(md["model_config"]));
    if (plan.config.num_hidden_layers > static_cast<int64_t>(src.tensors().size()))
      return Status::Error(ErrorKind::kNotFound, "MissingTensor", "model config says " + std::to_string(plan.config.num_hidden_layers) +
                                                                  " layers but '" + src.describe() + "' holds only " +
                                                                  std::to_string(src.tensors().size()) + " tensors");
  std::map<std::string, const TensorMeta*> by_name;
  for (const auto& t : src.tensors()) by_name[t.name] = &t;
  std::set<std::string> wanted;
  std::set<DType> dts;
  for (const TensorMeta& want : llama_model_tensors(plan.config, plan.config.dtype)) {
    wanted.insert(want.name);
    auto it = by_name.find(want.name);
    if (it == by_name.end())
      return Status::Error(ErrorKind::kNotFound, "MissingTensor",
                           "'" + src.describe() + "' has no tensor '" + want.name + "' " + shape_to_string(want.shape) +
                               " required by config.json").with_tensor(want.name);
    if (it->second->shape != want.shape)
      return Status::Corruption("ShapeMismatch", "tensor '" + want.name + "' has shape " + shape_to_string(it->second->shape) +
                                                     ", config.json expects " + shape_to_string(want.shape)).with_tensor(want.name);
    DType dt = opts.dtype && dtype_is_float(it->second->dtype) ? *opts.dtype : it->second->dtype;
    dts.insert(dt);
    plan.tensors.push_back(TensorMeta{want.name, dt, want.shape});
    plan.pieces.push_back(Piece{want.name, Region{Box::whole(want.shape)}, dt});
    auto n = checked_numel(want.shape);
    auto b = n ? checked_mul(static_cast<uint64_t>(*n), static_cast<uint64_t>(dtype_size(dt))) : std::nullopt;
    auto tot = b ? checked_add(plan.total_bytes, *b) : std::nullopt;
    if (!tot) return Status::Corruption("ShapeOverflow", "tensor '" + want.name + "' size overflows");
    plan.total_bytes = *tot;
  }
  for (const auto& t : src.tensors()) {
    if (wanted.count(t.name)) continue;
    if (t.name.ends_with(".rotary_emb.inv_freq") || (plan.config.tie_word_embeddings && t.name == "lm_head.weight")) {
      plan.skipped.push_back(t.name);
      continue;
    }
    return Status::Corruption("UnexpectedTensor", "tensor '" + t.name + "' in '" + src.describe() +
                                                      "' is not a LLaMA weight of its config.json").with_tensor(t.name);
  }
  std::optional<DType> cfg_dt;
  if (dts.size() == 1 && !hf_dtype_string(*dts.begin()).empty()) cfg_dt = *dts.begin();
  CKPT_ASSIGN_OR_RETURN(auto cfg_json, hf_config_with_dtype(md["model_config"], cfg_dt));
  if (cfg_dt) plan.config.dtype = *cfg_dt;
  CKPT_ASSIGN_OR_RETURN(Layout layout, Layout::make(1, 1, 1, 0, static_cast<int>(plan.config.num_hidden_layers)));
  plan.metadata = nlohmann::json::object();
  plan.metadata["model_config"] = std::move(cfg_json);
  plan.metadata["layout"] = layout.to_json();
  plan.metadata["profile"] = "reference";
  return plan;
}

Status run_hf_import(TensorSource& src, TensorSink& sink, const HfImportPlan& plan, const HfImportOptions& opts) {
  ExecOptions eo;
  eo.threads = opts.threads;
  eo.progress = opts.progress;
  return execute(src, sink, plan.tensors, plan.pieces, plan.metadata, eo);
}

}  // namespace ckpt
