#include "converters/megatron/dist/megatron_dist_export.h"

#include <filesystem>
#include <optional>
#include <system_error>

#include "converters/megatron/dist/megatron_dist_common.h"
#include "converters/megatron/dist/megatron_dist_optim.h"
#include "converters/megatron/dist/megatron_dist_sink.h"
#include "converters/megatron/megatron_dist_opt_export.h"
#include "converters/megatron/megatron_moe_args.h"
#include "converters/megatron/megatron_vpp.h"
#include "converters/model/llama_sharding.h"
#include "formats/torch/dcp/dcp_writer.h"
#include "formats/torch/pickle/py_json.h"
#include "reshard/executor.h"

namespace ckpt {

namespace dist_export_detail {

using torch::PyArena;
using torch::PyObj;

// The common state: {'args': argparse.Namespace(**args), 'checkpoint_version': 3.0, 'iteration': N},
// with optimizer state 'optimizer': {'state': {'common_step': step}} (what FP32Optimizer.
// sharded_state_dict leaves outside the sharded tensors besides the param groups), with the
// distributed optimizer (`dist_opt`: its sharding type) 'optimizer': {'param_state_sharding_type': T}
// (fully_reshardable: and 'optimizer': {'param_groups': ...}) and 'content_metadata' (what
// Megatron-LM's save_checkpoint passes to dist_checkpointing.save); with optimizer state and an imported
// scheduler (optim["opt_param_scheduler"]) 'opt_param_scheduler'.
const PyObj* common_root(PyArena& a, const nlohmann::json& args, int64_t iteration, std::optional<int64_t> step,
                         const std::string& dist_opt, const nlohmann::json& optim) {
  std::vector<std::pair<const PyObj*, const PyObj*>> attrs;
  for (const auto& [k, v] : args.items()) attrs.emplace_back(a.str(k), torch::json_to_pyobj(a, v));
  const PyObj* ns = a.record("argparse.Namespace", a.tuple({}), a.dict(std::move(attrs)), /*newobj=*/true);
  std::vector<std::pair<const PyObj*, const PyObj*>> root = {{a.str("args"), ns},
                                                             {a.str("checkpoint_version"), a.real(3.0)},
                                                             {a.str("iteration"), a.integer(iteration)}};
  if (!dist_opt.empty()) {  // fully_reshardable keeps the param groups here, dp_reshardable in its ShardedObjects
    std::vector<std::pair<const PyObj*, const PyObj*>> o;
    if (dist_opt == "fully_reshardable") o.emplace_back(a.str("optimizer"), dist_opt_param_groups(a, optim));
    o.emplace_back(a.str("param_state_sharding_type"), a.str(dist_opt));
    root.emplace_back(a.str("optimizer"), a.dict(std::move(o)));
    root.emplace_back(a.str("content_metadata"),
                      a.dict({{a.str("distrib_optim_sharding_type"), a.str(dist_opt)},
                              {a.str("singleton_local_shards"), a.boolean(false)},
                              {a.str("chained_optim_avoid_prefix"), a.boolean(true)}}));
  } else if (step) {
    root.emplace_back(a.str("optimizer"),
                      a.dict({{a.str("state"), a.dict({{a.str("common_step"), a.integer(*step)}})}}));
  }
  // Megatron-LM saves the scheduler beside the optimizer: the imported one, written back as read
  if ((!dist_opt.empty() || step) && optim.contains("opt_param_scheduler"))
    root.emplace_back(a.str("opt_param_scheduler"), torch::json_to_pyobj(a, optim["opt_param_scheduler"]));
  return a.dict(std::move(root));
}

// --dist-opt: the dp_reshardable state of every model-parallel group g (DistributedOptimizer.
// sharded_param_state_dp_reshardable): per bucket b and state, the 1-D tensor
// optimizer.distributed.dp_group_idx_{g}.gbuf_idx_{c}.dtype_{(param, grad dtype)}.bucket_idx_{b}.{state}
// (c: the model chunk of a virtual pipeline, else 0)
// of the bucket's numel_unpadded elements, one chunk in group g's file; and the ShardedObjects
// dp_group_idx_{g}.optimizer (the param groups with the step), .per_bucket_numel and
// .per_bucket_numel_unpadded ([{(dtypes): [sizes]}] per grad buffer).
Status add_dp_reshardable(const std::vector<DistOptGroupBuffers>& groups, DType param_dtype, const nlohmann::json& optim,
                          std::vector<DistTensor>& map, std::vector<torch::DcpBytesEntry>& bytes) {
  const std::string dkey = dist_optim_dtype_key(torch::torch_dtype_name(param_dtype), torch::torch_dtype_name(DType::kF32));
  for (size_t first = 0; first < groups.size();) {  // one dp_group: its grad buffers (one per model chunk), in chunk order
    size_t end = first;
    while (end < groups.size() && groups[end].group == groups[first].group) ++end;
    const int rank = groups[first].group;  // = pp_rank * tp + tp_rank, the group's file
    const std::string pre = std::string(kDistOptimBucketPrefix) + std::to_string(rank);
    PyArena a;
    std::vector<const PyObj*> per_gbuf[2];  // per_bucket_numel, per_bucket_numel_unpadded
    for (size_t i = first; i < end; ++i) {
      const DistOptGroupBuffers& gb = groups[i];
      const std::string gbuf = ".gbuf_idx_" + std::to_string(gb.chunk);
      for (size_t b = 0; b < gb.numel_unpadded.size(); ++b)
        for (const char* st : kDistOptStates) {
          if (!gb.states.count(st)) continue;  // Lion: no exp_avg_sq
          const int64_t n = gb.numel_unpadded[b];
          DistChunk c{Box{{0}, {n}}, 0, gb.states.at(st)[b], rank};
          map.push_back(DistTensor{pre + gbuf + ".dtype_" + dkey + ".bucket_idx_" + std::to_string(b) + "." + st, {n}, {std::move(c)}});
        }
      for (int k = 0; k < 2; ++k) {
        std::vector<const PyObj*> sizes;
        for (int64_t v : k == 0 ? gb.numel : gb.numel_unpadded) sizes.push_back(a.integer(v));
        per_gbuf[k].push_back(a.dict({{dist_opt_dtype_key(a, param_dtype), a.list(std::move(sizes))}}));
      }
    }
    CKPT_ASSIGN_OR_RETURN(std::string groups_bytes, torch::torch_save_bytes(a.list({dist_opt_param_groups(a, optim)})));
    bytes.push_back({pre + ".optimizer/shard_0_1", std::move(groups_bytes), rank});
    for (int k = 0; k < 2; ++k) {
      CKPT_ASSIGN_OR_RETURN(std::string sb, torch::torch_save_bytes(a.list({a.list(std::move(per_gbuf[k]))})));
      bytes.push_back({pre + "." + (k == 0 ? "per_bucket_numel" : "per_bucket_numel_unpadded") + "/shard_0_1", std::move(sb), rank});
    }
    first = end;
  }
  return Status::Ok();
}

// "0.16" .. "0.19": whether the common state is the DCP item common_state (0.19) or common.pt.
Result<bool> common_state_in_dcp(const std::string& version) {
  if (version == "0.19") return true;
  if (version == "0.16" || version == "0.17" || version == "0.18") return false;
  return Status::Error("UnsupportedMegatronVersion", "--megatron-version '" + version +
                                                         "': ckpt writes the torch_dist layouts of megatron-core 0.16, "
                                                         "0.17, 0.18 (common.pt) and 0.19 (common_state)");
}

// The optimizer tensors of megatron-core's sharded optimizer state dict (FP32Optimizer /
// Float16OptimizerWithFloat16Params.sharded_state_dict: optim_state_to_sharding_state and
// make_sharded_optimizer_tensor give each state tensor the key optimizer.state.<kind>.<model key>
// and its parameter's sharding): one DistTensor per model tensor and kind `src` holds, its
// segments over the canonical optimizer.<kind>.<HF name>. Returns whether any was added.
using OptimKinds = std::vector<std::pair<std::string, std::string>>;  // (torch_dist prefix, canonical prefix)
bool add_dist_optimizer_tensors(const SourceIndex& index, std::vector<DistTensor>& map,
                                const OptimKinds& kinds = {{"optimizer.state.exp_avg.", "optimizer.exp_avg."},
                                                           {"optimizer.state.exp_avg_sq.", "optimizer.exp_avg_sq."},
                                                           {"optimizer.state.fp32_param.", "optimizer.fp32_param."}}) {
  const size_t n = map.size();
  bool any = false;
  for (const auto& [dist, canonical] : kinds) {
    if (!index.tensor_index.count(canonical + "model.norm.weight")) continue;
    any = true;
    for (size_t i = 0; i < n; ++i) {
      DistTensor t = map[i];
      t.key = dist + t.key;
      for (auto& c : t.chunks)
        for (auto& sg : c.segments)
          if (!sg.tensor.empty()) sg.tensor = canonical + sg.tensor;
      map.push_back(std::move(t));
    }
  }
  return any;
}

std::optional<int64_t> source_step(const nlohmann::json& meta) {
  if (meta.contains("trainer") && meta["trainer"].is_object() && meta["trainer"].contains("step") &&
      meta["trainer"]["step"].is_number_integer())
    return meta["trainer"]["step"].get<int64_t>();
  if (meta.contains("megatron") && meta["megatron"].is_object() && meta["megatron"].contains("optimizer_step") &&
      meta["megatron"]["optimizer_step"].is_number_integer())
    return meta["megatron"]["optimizer_step"].get<int64_t>();
  return std::nullopt;
}

// The _extra_state bytes items of the local spec's linear layers: torch.save([None]) per layer,
// keyed <module>._extra_state/shard_<layer>_<num_layers>, in the file of the layer's rank.
// An MoE model's _extra_state objects (its layers one key each, as megatron-core 0.16 saves them):
// <module>._extra_state/shard_0_1 per linear module of a layer, shard_<e>_<E> per expert of the
// layer's experts.experts.linear_fc1 / fc2; each in the file of a rank writing the weight.
std::vector<torch::DcpBytesEntry> moe_extra_states(const std::vector<DistTensor>& map, const std::string& none_list) {
  std::vector<torch::DcpBytesEntry> out;
  auto ends = [](const std::string& s, const std::string& x) {
    return s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  for (const auto& t : map) {
    if (t.key.rfind("decoder.layers.", 0) != 0 || !ends(t.key, ".weight") || t.chunks.empty()) continue;
    const std::string module = t.key.substr(0, t.key.size() - 7);
    if (ends(module, "mlp.experts.experts.linear_fc1") || ends(module, "mlp.experts.experts.linear_fc2")) {
      std::vector<int> rank_of(static_cast<size_t>(t.shape[0]), -1);
      for (const auto& c : t.chunks)
        if (rank_of[c.box.offset[0]] < 0) rank_of[c.box.offset[0]] = c.rank;
      for (int64_t e = 0; e < t.shape[0]; ++e)
        out.push_back(torch::DcpBytesEntry{module + "._extra_state/shard_" + std::to_string(e) + "_" + std::to_string(t.shape[0]),
                                           none_list, std::max(rank_of[e], 0)});
      continue;
    }
    for (const char* m : {"self_attention.linear_proj", "self_attention.linear_qkv", "mlp.linear_fc1", "mlp.linear_fc2",
                          "mlp.shared_experts.linear_fc1", "mlp.shared_experts.linear_fc2"})
      if (ends(module, std::string(".") + m))
        out.push_back(torch::DcpBytesEntry{module + "._extra_state/shard_0_1", none_list, t.chunks.front().rank});
  }
  return out;
}

Result<std::vector<torch::DcpBytesEntry>> extra_states(const std::vector<DistTensor>& map, int64_t layers, bool moe) {
  PyArena a;
  CKPT_ASSIGN_OR_RETURN(std::string none_list, torch::torch_save_bytes(a.list({a.none()})));
  if (moe) return moe_extra_states(map, none_list);
  std::vector<torch::DcpBytesEntry> out;
  for (const char* module : {"self_attention.linear_proj", "self_attention.linear_qkv", "mlp.linear_fc1", "mlp.linear_fc2"}) {
    const std::string weight = std::string("decoder.layers.") + module + ".weight";
    for (const auto& t : map) {
      if (t.key != weight) continue;
      std::vector<int> rank_of(static_cast<size_t>(layers), -1);
      for (const auto& c : t.chunks)
        if (rank_of[c.box.offset[0]] < 0) rank_of[c.box.offset[0]] = c.rank;
      for (int64_t l = 0; l < layers; ++l)
        out.push_back(torch::DcpBytesEntry{std::string("decoder.layers.") + module + "._extra_state/shard_" +
                                               std::to_string(l) + "_" + std::to_string(layers),
                                           none_list, std::max(rank_of[l], 0)});
    }
  }
  return out;
}

int64_t source_iteration(const nlohmann::json& meta) {
  for (const char* k : {"trainer", "megatron"})
    if (meta.contains(k) && meta[k].is_object())
      for (const char* f : {"iteration", "step"})
        if (meta[k].contains(f) && meta[k][f].is_number_integer()) return meta[k][f].get<int64_t>();
  return 0;
}

// The DCP tensors and their chunks of `layout` (each chunk in its rank's file). A virtual pipeline:
// the keys and chunks are those of its plain pipeline of pp * vpp chunk stages (global layer
// indices, megatron_vpp.h); each chunk is written by the real rank holding it.
Result<std::vector<DistTensor>> chunk_map(const LlamaConfig& cfg, const Layout& layout, const MegatronExportOptions& opts) {
  if (opts.vpp < 1) return Status::InvalidArgument("export-megatron --vpp " + std::to_string(opts.vpp) + ": must be >= 1");
  Layout stages = layout;
  if (opts.vpp > 1) {
    CKPT_ASSIGN_OR_RETURN(stages, megatron_vpp_layout(layout, opts.vpp, "export-megatron --pp " + std::to_string(opts.pp) +
                                                                            " --vpp " + std::to_string(opts.vpp)));
  }
  CKPT_ASSIGN_OR_RETURN(std::vector<DistTensor> map, megatron_dist_tensors(cfg, stages, opts.norms));
  if (opts.vpp > 1)
    for (auto& t : map)
      for (auto& c : t.chunks) {
        const int stage = c.rank / layout.tp;
        c.rank = megatron_vpp_of_stage(layout.pp, stage).pp_rank * layout.tp + c.rank % layout.tp;
      }
  return map;
}

// Each mcore tensor's dtype (`dtypes`, by map index): the requested one (weights), else its first
// canonical tensor's; the buckets and the masters fp32 whatever the weights. `canonical`: the
// source tensors the map reads, by name, once each.
void output_dtypes(const TensorSource& src, const SourceIndex& index, const std::vector<DistTensor>& map,
                   const std::optional<DType>& dtype, std::vector<DType>& dtypes, std::vector<TensorMeta>& canonical) {
  for (const auto& t : map) {
    DType dt = dtype.value_or(DType::kF32);
    const bool buckets = t.key.rfind(kDistOptimBucketPrefix, 0) == 0 ||  // fp32 whatever the weights
                         t.key.rfind(kDistMasterParamPrefix, 0) == 0;
    const bool keep = !buckets && (!dtype || t.key.rfind("optimizer.", 0) == 0);
    for (const auto& c : t.chunks)
      for (const auto& s : c.segments) {
        auto it = s.tensor.empty() ? index.tensor_index.end() : index.tensor_index.find(s.tensor);
        if (it == index.tensor_index.end()) continue;
        if (keep) dt = src.tensors()[it->second].dtype;
        canonical.push_back(src.tensors()[it->second]);
      }
    dtypes.push_back(buckets ? DType::kF32 : dt);
  }
  std::sort(canonical.begin(), canonical.end(), [](const TensorMeta& a, const TensorMeta& b) { return a.name < b.name; });
  canonical.erase(std::unique(canonical.begin(), canonical.end()), canonical.end());
}

}  // namespace dist_export_detail

Status export_megatron_dist(TensorSource& src, const std::string& dst, const MegatronExportOptions& opts) {
  using namespace dist_export_detail;
  const nlohmann::json& meta = src.metadata();
  if (!meta.is_object() || !meta.contains("model_config"))
    return Status::NotFound("source '" + src.describe() +
                            "' carries no model config (config.json / manifest model_config); export-megatron needs it");
  CKPT_ASSIGN_OR_RETURN(LlamaConfig cfg, LlamaConfig::from_json(meta["model_config"]));
  if (cfg.num_hidden_layers > (1 << 20)) return Status::Unsupported("more than 2^20 layers");
  if (cfg.moe) CKPT_RETURN_IF_ERROR(megatron_moe_export_check(cfg, opts.vpp, opts.dist_opt.enabled, src.tensors()));
  CKPT_ASSIGN_OR_RETURN(Layout layout, megatron_export_layout(cfg, opts.tp, opts.pp, opts.ep, opts.etp, opts.layers_per_stage));
  layout.vocab_divisor = opts.vocab_divisor;
  CKPT_RETURN_IF_ERROR(LlamaShardingRules(cfg).check_layout(layout));
  CKPT_ASSIGN_OR_RETURN(std::vector<DistTensor> map, chunk_map(cfg, layout, opts));
  CKPT_ASSIGN_OR_RETURN(const bool in_dcp, common_state_in_dcp(opts.megatron_version));
  CKPT_ASSIGN_OR_RETURN(SourceIndex index, SourceIndex::build(src));
  nlohmann::json args = megatron_vpp_args(megatron_args(cfg, layout), opts.vpp);
  std::vector<torch::DcpBytesEntry> bytes;
  nlohmann::json optim_fields = megatron_optimizer_fields(meta);
  bool optim = false;
  if (opts.dist_opt.enabled) {  // the distributed optimizer's buckets instead of per-parameter state
    CKPT_ASSIGN_OR_RETURN(DistOptSourceState st, check_dist_opt_source(src, opts.dist_opt, true));
    const bool masters = st.fp32_masters;
    optim_fields["optimizer"] = st.optimizer;
    args.update(dist_opt_args(opts.dist_opt, layout.tp, layout.pp, optim_fields));
    if (opts.dist_opt.sharding == "fully_reshardable") {  // per parameter, chunked like it; masters as 'param'
      add_dist_optimizer_tensors(index, map, {{kDistMasterParamPrefix, masters ? "optimizer.fp32_param." : ""},
                                              {"optimizer.state.exp_avg.", "optimizer.exp_avg."},
                                              {"optimizer.state.exp_avg_sq.", "optimizer.exp_avg_sq."}});
    } else {
      CKPT_ASSIGN_OR_RETURN(auto groups, dist_opt_buffers(cfg, layout, args, masters, src.describe(), opts.vpp));
      CKPT_RETURN_IF_ERROR(add_dp_reshardable(groups, opts.dtype.value_or(DType::kF32), optim_fields, map, bytes));
    }
  } else {
    optim = add_dist_optimizer_tensors(index, map);
  }
  std::vector<DType> dtypes;
  std::vector<TensorMeta> canonical;
  output_dtypes(src, index, map, opts.dtype, dtypes, canonical);
  std::error_code ec;
  if (std::filesystem::exists(dst, ec)) return Status::InvalidArgument("destination '" + dst + "' already exists");
  args["ckpt_format"] = "torch_dist";
  args["transformer_impl"] = "local";
  if (layout.pp > 1 && opts.vpp == 1) {  // Megatron-LM's names for an uneven split (first / last stage sizes)
    args["decoder_first_pipeline_num_layers"] = args["layers_per_stage"].front();
    args["decoder_last_pipeline_num_layers"] = args["layers_per_stage"].back();
  }
  const int64_t iteration = source_iteration(meta);
  args["iteration"] = iteration;
  std::optional<int64_t> step = optim ? source_step(meta) : std::nullopt;
  if (optim && !step) step = iteration;
  PyArena a;
  const PyObj* common =
      common_root(a, args, iteration, step, opts.dist_opt.enabled ? opts.dist_opt.sharding : "", optim_fields);
  CKPT_ASSIGN_OR_RETURN(auto extra, extra_states(map, cfg.num_hidden_layers, cfg.moe.has_value()));
  for (auto& e : extra) bytes.push_back(std::move(e));
  std::vector<std::pair<std::string, std::string>> files;
  if (in_dcp) {  // 0.19: ShardedObject('common_state', state, (1,), (0,)): torch.save([state]) in rank 0's file
    CKPT_ASSIGN_OR_RETURN(std::string cs, torch::torch_save_bytes(a.list({common})));
    bytes.push_back({kMegatronCommonStateItem, std::move(cs), 0});
    files.emplace_back("metadata.json", R"({"sharded_backend": "torch_dist", "sharded_backend_version": 1})");
  } else {
    CKPT_ASSIGN_OR_RETURN(std::string cs, torch::torch_save_bytes(common));
    files.emplace_back("common.pt", std::move(cs));
    files.emplace_back("metadata.json",
                       R"({"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch", "common_backend_version": 1})");
  }
  DistSegmentSink sink(dst, std::move(map), std::move(dtypes), std::move(bytes), std::move(files), opts.write_pool);
  ExecOptions eo;
  eo.max_chunk_bytes = opts.chunk_bytes;
  eo.progress = opts.progress;
  eo.before_commit = opts.before_commit;
  return execute(src, sink, canonical, sink.pieces(), nlohmann::json::object(), eo);
}

}  // namespace ckpt
