#include "converters/hf/hf_import.h"
#include "converters/quant/quant_sharding.h"

#include <map>
#include <set>

#include "converters/hf/hf_export.h"
#include "converters/hf/hf_files.h"
#include "converters/hf/hf_moe_names.h"
#include "converters/model/llama_sharding.h"
#include "converters/model/weight_dtype.h"
#include "formats/base/checked.h"
#include "reshard/executor.h"
#include "reshard/layout/layout.h"
#include "reshard/planner.h"

namespace ckpt {

Result<HfImportPlan> plan_hf_import(const TensorSource& src, const HfImportOptions& opts) {
  const auto& md = src.metadata();
  if (!md.is_object() || !md.contains("model_config"))
    return Status::NotFound("'" + src.describe() + "' has no config.json: a HuggingFace LLaMA directory needs one");
  HfImportPlan plan;
  CKPT_ASSIGN_OR_RETURN(plan.config, LlamaConfig::from_json(md["model_config"]));
  // Every layer has at least 9 tensors: bound the tensor list built from the config by the source size.
  if (plan.config.num_hidden_layers > static_cast<int64_t>(src.tensors().size() / 9 + 1))
    return Status::Error("MissingTensor", "model config says " + std::to_string(plan.config.num_hidden_layers) +
                                                                " layers but '" + src.describe() + "' holds only " +
                                                                std::to_string(src.tensors().size()) + " tensors");
  std::map<std::string, const TensorMeta*> by_name;
  std::set<std::string> wanted;
  if (plan.config.moe && plan.config.family != ModelFamily::kGptOss) {  // experts per expert or fused: the canonical tensors
    CKPT_ASSIGN_OR_RETURN(HfAliases al, hf_moe_import_aliases(plan.config, llama_model_tensors(plan.config, plan.config.dtype),
                                                              src.tensors()));
    // Scales kept as stored (--keep-quantized) that the aliases do not carry: as they are.
    std::set<std::string> viewed;
    for (const auto& t : al.tensors) viewed.insert(t.name);
    for (const auto& t : src.tensors())
      if (!al.used.count(t.name) && !viewed.count(t.name) && opts.keep_as_stored.count(t.name)) {
        al.tensors.push_back(t);
        al.aliases.push_back(TensorAlias{t.name, Box::whole(t.shape), t.name, Box::whole(t.shape)});
      }
    plan.alias_tensors = std::move(al.tensors);
    plan.aliases = std::move(al.aliases);
    wanted = std::move(al.used);
  }
  for (const auto& t : plan.aliases.empty() ? src.tensors() : plan.alias_tensors) by_name[t.name] = &t;
  std::set<DType> dts;
  for (const TensorMeta& want : llama_model_tensors(plan.config, plan.config.dtype)) {
    wanted.insert(want.name);
    auto it = by_name.find(want.name);
    if (it == by_name.end() && opts.keep_as_stored.count(want.name + "_blocks")) continue;  // MXFP4 kept as stored
    if (it == by_name.end())
      return Status::Error("MissingTensor",
                           "'" + src.describe() + "' has no tensor '" + want.name + "' " + shape_to_string(want.shape) +
                               " required by config.json").with_tensor(want.name);
    if (it->second->shape != want.shape)
      return Status::Error("ShapeMismatch", "tensor '" + want.name + "' has shape " + shape_to_string(it->second->shape) +
                                                     ", config.json expects " + shape_to_string(want.shape)).with_tensor(want.name);
    CKPT_RETURN_IF_ERROR(check_float_weight(*it->second, src.describe()));
    const bool keep = opts.keep_as_stored.count(want.name) > 0;
    DType dt = !keep && opts.dtype && dtype_is_float(it->second->dtype) ? *opts.dtype : it->second->dtype;
    if (!keep) dts.insert(dt);
    plan.tensors.push_back(TensorMeta{want.name, dt, want.shape});
    plan.pieces.push_back(Piece{want.name, Region{Box::whole(want.shape)}, dt});
    auto n = checked_numel(want.shape);
    auto b = n ? checked_mul(static_cast<uint64_t>(*n), static_cast<uint64_t>(dtype_size(dt))) : std::nullopt;
    auto tot = b ? checked_add(plan.total_bytes, *b) : std::nullopt;
    if (!tot) return Status::Error("ShapeOverflow", "tensor '" + want.name + "' size overflows");
    plan.total_bytes = *tot;
  }
  std::vector<TensorMeta> rest = src.tensors();
  std::set<std::string> in_src;
  for (const auto& t : rest) in_src.insert(t.name);
  for (const auto& t : plan.alias_tensors)  // stacked expert scales (hf_moe_names.h)
    if (!in_src.count(t.name)) rest.push_back(t);
  for (const auto& t : rest) {
    if (wanted.count(t.name)) continue;
    if (opts.keep_as_stored.count(t.name)) {  // a quantized weight's scales, as stored
      plan.tensors.push_back(t);
      plan.pieces.push_back(Piece{t.name, Region{Box::whole(t.shape)}, t.dtype});
      plan.total_bytes += static_cast<uint64_t>(checked_numel(t.shape).value_or(0)) * dtype_size(t.dtype);
      continue;
    }
    if (t.name.ends_with(".rotary_emb.inv_freq") || (plan.config.tie_word_embeddings && t.name == "lm_head.weight")) {
      plan.skipped.push_back(t.name);
      continue;
    }
    return Status::Error("UnexpectedTensor", "tensor '" + t.name + "' in '" + src.describe() +
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
  if (!opts.side_files_dir.empty()) {
    CKPT_ASSIGN_OR_RETURN(auto files, collect_hf_files(opts.side_files_dir));
    if (!files.empty()) plan.metadata[kHfFilesKey] = std::move(files);
  }
  return plan;
}

namespace {

class ImportView final : public TensorSource {
 public:
  // `owned`: the alias view `src` is, kept alive with this view (null: src is the caller's).
  ImportView(TensorSource& src, const HfImportPlan& plan, std::unique_ptr<TensorSource> owned)
      : owned_(std::move(owned)), src_(src) {
    tensors_ = plan.tensors;
    std::map<std::string, size_t> want;
    for (size_t i = 0; i < tensors_.size(); ++i) want[tensors_[i].name] = i;
    for (size_t i = 0; i < src.pieces().size(); ++i) {
      if (!want.count(src.pieces()[i].tensor)) continue;
      pieces_.push_back(src.pieces()[i]);
      map_.push_back(i);
    }
  }
  const std::vector<TensorMeta>& tensors() const override { return tensors_; }
  const std::vector<Piece>& pieces() const override { return pieces_; }
  Status read(size_t piece, const Box& sub, void* dst) override {
    if (piece >= map_.size()) return Status::Internal("import view: piece " + std::to_string(piece) + " out of range");
    return src_.read(map_[piece], sub, dst);
  }
  std::optional<FileExtent> file_extent(size_t piece, const Box& sub) override {
    return piece < map_.size() ? src_.file_extent(map_[piece], sub) : std::nullopt;
  }
  const nlohmann::json& metadata() const override { return src_.metadata(); }
  std::string describe() const override { return src_.describe(); }
  IntegrityInfo integrity() const override { return src_.integrity(); }
  CheckReport check(const CheckOptions& o) override { return check_of_inner(src_, o, false); }
  Status check_piece(size_t piece) override {
    if (piece >= map_.size()) return Status::Internal("import view piece " + std::to_string(piece) + " out of range");
    return src_.check_piece(map_[piece]);
  }
  void set_read_threads(int threads) override { src_.set_read_threads(threads); }
  std::optional<RangeCheck> range_check(size_t piece) override {
    return piece < map_.size() ? src_.range_check(map_[piece]) : std::nullopt;
  }
  uint64_t read_memory(int threads) const override { return src_.read_memory(threads); }

 private:
  std::unique_ptr<TensorSource> owned_;
  TensorSource& src_;
  std::vector<TensorMeta> tensors_;
  std::vector<Piece> pieces_;
  std::vector<size_t> map_;  // view piece -> source piece
};

}  // namespace

Result<std::unique_ptr<TensorSource>> make_import_view(TensorSource& src, const HfImportPlan& plan) {
  if (plan.aliases.empty()) return std::unique_ptr<TensorSource>(std::make_unique<ImportView>(src, plan, nullptr));
  CKPT_ASSIGN_OR_RETURN(auto aliased, make_alias_view(src, plan.alias_tensors, plan.aliases));
  TensorSource& inner = *aliased;
  return std::unique_ptr<TensorSource>(std::make_unique<ImportView>(inner, plan, std::move(aliased)));
}

Status run_hf_import_to_layout(TensorSource& src, const HfImportPlan& plan, const Layout& layout, const std::string& dst,
                               const StoreExecOptions& opts, Comm* dist) {
  CKPT_ASSIGN_OR_RETURN(auto view, make_import_view(src, plan));
  LlamaShardingRules llama(plan.config);
  // A quantized weight kept as stored moves with its scales (converters/quant/quant_sharding.h).
  CKPT_ASSIGN_OR_RETURN(QuantScheme scheme, find_quantized(view->tensors(), plan.metadata));
  QuantShardingRules quant(llama, scheme);
  const ShardingRules& rules = scheme.any() ? static_cast<const ShardingRules&>(quant) : llama;
  CKPT_ASSIGN_OR_RETURN(Plan rp, make_plan(view->tensors(), view->pieces(), plan.metadata, layout, rules, opts.exec));
  return execute_plan_to_store(*view, rp, dst, opts, dist);
}

Status run_hf_import(TensorSource& src, TensorSink& sink, const HfImportPlan& plan, const HfImportOptions& opts) {
  ExecOptions eo;
  eo.threads = opts.threads;
  eo.max_chunk_bytes = opts.max_chunk_bytes;
  eo.progress = opts.progress;
  eo.before_commit = opts.before_commit;
  if (plan.aliases.empty()) return execute(src, sink, plan.tensors, plan.pieces, plan.metadata, eo);
  CKPT_ASSIGN_OR_RETURN(auto view, make_alias_view(src, plan.alias_tensors, plan.aliases));
  return execute(*view, sink, plan.tensors, plan.pieces, plan.metadata, eo);
}

}  // namespace ckpt
