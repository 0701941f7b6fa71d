#include "converters/hf/hf_export.h"
#include "converters/hf/hf_files.h"
#include "converters/hf/hf_moe_names.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "converters/model/weight_dtype.h"
#include "formats/base/checked.h"
#include "formats/safetensors/st_dir.h"
#include "reshard/executor.h"

namespace ckpt {

namespace fs = std::filesystem;

std::string hf_dtype_string(DType t) {
  switch (t) {
    case DType::kBF16: return "bfloat16";
    case DType::kF16: return "float16";
    case DType::kF32: return "float32";
    default: return "";
  }
}

Result<nlohmann::json> hf_config_with_dtype(const nlohmann::json& config, std::optional<DType> dt) {
  CKPT_ASSIGN_OR_RETURN(LlamaConfig c, LlamaConfig::from_json(config));
  (void)c;
  nlohmann::json j = config;
  if (dt) {
    std::string s = hf_dtype_string(*dt);
    if (s.empty()) return Status::InvalidArgument("dtype " + std::string(dtype_name(*dt)) + " has no HuggingFace config name");
    if (j.contains("dtype") || !j.contains("torch_dtype")) j["dtype"] = s;
    if (j.contains("torch_dtype")) j["torch_dtype"] = s;
  }
  return j;
}

namespace {

bool skipped_name(const std::string& n) {
  return n.rfind("optimizer.", 0) == 0 || n.ends_with(".rotary_emb.inv_freq");
}

DType out_dtype(DType src, const std::optional<DType>& want) { return want && dtype_is_float(src) ? *want : src; }
DType out_dtype(const TensorMeta& t, const HfExportOptions& o) { return o.keep_as_stored.count(t.name) ? t.dtype : out_dtype(t.dtype, o.dtype); }

}  // namespace

Result<HfExportPlan> plan_hf_export(const TensorSource& src, const std::string& src_path, const HfExportOptions& opts) {
  HfExportPlan plan;
  std::map<std::string, const TensorMeta*> by_name;
  for (const auto& t : src.tensors()) by_name[t.name] = &t;
  const auto& md = src.metadata();
  std::set<DType> out_dtypes;
  if (md.is_object() && md.contains("model_config")) {
    const auto& cfg_json = md["model_config"];
    CKPT_ASSIGN_OR_RETURN(LlamaConfig cfg, LlamaConfig::from_json(cfg_json));
    // Every layer has at least 9 tensors: bound the tensor list built from the config by the source size.
    if (cfg.num_hidden_layers > static_cast<int64_t>(src.tensors().size() / 9 + 1))
      return Status::Error("MissingTensor", "model config says " + std::to_string(cfg.num_hidden_layers) +
                                                                  " layers but '" + src.describe() + "' holds only " +
                                                                  std::to_string(src.tensors().size()) + " tensors");
    std::set<std::string> wanted;
    for (const TensorMeta& want : llama_model_tensors(cfg, cfg.dtype)) {
      wanted.insert(want.name);
      auto it = by_name.find(want.name);
      if (it == by_name.end() && opts.stored_elsewhere.count(want.name)) continue;
      if (it == by_name.end())
        return Status::Error("MissingTensor",
                             "'" + src.describe() + "' has no tensor '" + want.name + "' " + shape_to_string(want.shape) +
                                 " required by its model config").with_tensor(want.name);
      if (it->second->shape != want.shape)
        return Status::Error("ShapeMismatch", "tensor '" + want.name + "' has shape " + shape_to_string(it->second->shape) +
                                                       ", the model config expects " + shape_to_string(want.shape))
            .with_tensor(want.name);
      CKPT_RETURN_IF_ERROR(check_float_weight(*it->second, src.describe()));
      DType dt = out_dtype(*it->second, opts);
      plan.tensors.push_back(TensorMeta{want.name, dt, want.shape});
      if (!opts.keep_as_stored.count(want.name)) out_dtypes.insert(dt);
    }
    for (const auto& t : src.tensors()) {
      if (wanted.count(t.name)) continue;
      if (opts.keep_as_stored.count(t.name)) {  // a quantized weight's scales, kept as stored
        plan.tensors.push_back(t);
        continue;
      }
      if (skipped_name(t.name) || (cfg.tie_word_embeddings && t.name == "lm_head.weight")) {
        plan.skipped.push_back(t.name);
        continue;
      }
      return Status::Error("UnexpectedTensor", "tensor '" + t.name + "' is neither a model weight of the config (" +
                                                        std::to_string(wanted.size()) + " expected) nor optimizer state")
          .with_tensor(t.name);
    }
    if (cfg.moe) {  // the stacked experts under the family's per-expert names
      std::vector<TensorMeta> stored;
      for (const auto& t : plan.tensors) stored.push_back(TensorMeta{t.name, by_name[t.name]->dtype, t.shape});
      HfAliases al = hf_moe_export_aliases(cfg, stored);
      plan.tensors.clear();
      for (const auto& t : al.tensors) plan.tensors.push_back(TensorMeta{t.name, out_dtype(t.dtype, opts.dtype), t.shape});
      plan.alias_tensors = std::move(al.tensors);
      plan.aliases = std::move(al.aliases);
    }
    std::optional<DType> cfg_dt;
    if (out_dtypes.size() == 1 && !hf_dtype_string(*out_dtypes.begin()).empty()) cfg_dt = *out_dtypes.begin();
    CKPT_ASSIGN_OR_RETURN(auto j, hf_config_with_dtype(cfg_json, cfg_dt));
    plan.config = std::move(j);
  } else {
    for (const auto& t : src.tensors()) {
      if (skipped_name(t.name)) {
        plan.skipped.push_back(t.name);
        continue;
      }
      if (is_weight_name(t.name) && !opts.integer_weights) CKPT_RETURN_IF_ERROR(check_float_weight(t, src.describe()));
      plan.tensors.push_back(TensorMeta{t.name, out_dtype(t, opts), t.shape});
    }
  }
  for (const auto& t : plan.tensors) {
    plan.pieces.push_back(Piece{t.name, Region{Box::whole(t.shape)}, t.dtype});
    auto n = checked_numel(t.shape);
    auto b = n ? checked_mul(static_cast<uint64_t>(*n), static_cast<uint64_t>(dtype_size(t.dtype))) : std::nullopt;
    auto tot = b ? checked_add(plan.total_bytes, *b) : std::nullopt;
    if (!tot) return Status::Error("ShapeOverflow", "tensor '" + t.name + "' size overflows").with_tensor(t.name);
    plan.total_bytes = *tot;
  }
  std::error_code ec;
  auto carried = decode_hf_files(md);
  if (!carried.ok()) return carried.take_status().with_file(src_path);
  plan.side_files = std::move(*carried);
  if (fs::is_directory(src_path, ec)) {
    for (const auto& f : hf_side_file_names()) {
      fs::path p = fs::path(src_path) / f;
      if (!plan.side_files.count(f) && fs::is_regular_file(p, ec)) plan.copy_files[f] = p.string();
    }
  }
  return plan;
}

Status run_hf_export(TensorSource& src, const HfExportPlan& plan, const std::string& out, const HfExportOptions& opts) {
  safetensors::ShardedSinkOptions so;
  so.max_shard_size = opts.max_shard_size;
  so.fsync = opts.fsync;
  so.io = opts.io;
  so.read_ahead = opts.read_ahead.get();
  so.write_pool = opts.write_pool.get();
  so.copy_files = plan.copy_files;
  so.shard_metadata = opts.shard_metadata;
  so.extra_files = plan.side_files;
  if (plan.config) so.extra_files["config.json"] = plan.config->dump(2) + "\n";
  safetensors::ShardedSafetensorsSink sink(out, so);
  src.set_read_threads(opts.threads);  // a compressed store: decode on --threads
  return execute_export_plan(src, sink, plan, opts.threads, opts.max_chunk_bytes, opts.progress, opts.before_commit);
}

Status execute_export_plan(TensorSource& src, TensorSink& sink, const HfExportPlan& plan, int threads, uint64_t max_chunk_bytes,
                           const std::function<void(uint64_t, uint64_t)>& progress, const std::function<Status()>& before_commit) {
  ExecOptions eo;
  eo.before_commit = before_commit;
  eo.threads = threads;
  eo.max_chunk_bytes = max_chunk_bytes;
  eo.progress = progress;
  if (plan.aliases.empty()) return execute(src, sink, plan.tensors, plan.pieces, nlohmann::json::object(), eo);
  CKPT_ASSIGN_OR_RETURN(auto view, make_alias_view(src, plan.alias_tensors, plan.aliases));
  return execute(*view, sink, plan.tensors, plan.pieces, nlohmann::json::object(), eo);
}

}  // namespace ckpt
