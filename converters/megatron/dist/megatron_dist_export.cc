#include "converters/megatron/dist/megatron_dist_export.h"

#include <filesystem>
#include <optional>
#include <system_error>

#include "converters/megatron/dist/megatron_dist_sink.h"
#include "converters/megatron/megatron_vpp.h"
#include "converters/model/llama_sharding.h"
#include "formats/torch/dcp/dcp_writer.h"
#include "formats/torch/pickle/py_json.h"
#include "reshard/executor.h"

namespace ckpt {

namespace dist_export_detail {

using torch::PyArena;
using torch::PyObj;

// common.pt: {'args': argparse.Namespace(**args), 'checkpoint_version': 3.0, 'iteration': N}, and
// with optimizer state 'optimizer': {'state': {'common_step': step}} (what FP32Optimizer.
// sharded_state_dict leaves outside the sharded tensors besides the param groups).
Result<std::string> common_pt(const nlohmann::json& args, int64_t iteration, std::optional<int64_t> step) {
  PyArena a;
  std::vector<std::pair<const PyObj*, const PyObj*>> attrs;
  for (const auto& [k, v] : args.items()) attrs.emplace_back(a.str(k), torch::json_to_pyobj(a, v));
  const PyObj* ns = a.record("argparse.Namespace", a.tuple({}), a.dict(std::move(attrs)), /*newobj=*/true);
  std::vector<std::pair<const PyObj*, const PyObj*>> root = {{a.str("args"), ns},
                                                             {a.str("checkpoint_version"), a.real(3.0)},
                                                             {a.str("iteration"), a.integer(iteration)}};
  if (step)
    root.emplace_back(a.str("optimizer"),
                      a.dict({{a.str("state"), a.dict({{a.str("common_step"), a.integer(*step)}})}}));
  return torch::torch_save_bytes(a.dict(std::move(root)));
}

// The optimizer tensors of megatron-core's sharded optimizer state dict (FP32Optimizer /
// Float16OptimizerWithFloat16Params.sharded_state_dict: optim_state_to_sharding_state and
// make_sharded_optimizer_tensor give each state tensor the key optimizer.state.<kind>.<model key>
// and its parameter's sharding): one DistTensor per model tensor and kind `src` holds, its
// segments over the canonical optimizer.<kind>.<HF name>. Returns whether any was added.
bool add_dist_optimizer_tensors(const SourceIndex& index, std::vector<DistTensor>& map) {
  constexpr std::pair<const char*, const char*> kKinds[] = {{"optimizer.state.exp_avg.", "optimizer.exp_avg."},
                                                            {"optimizer.state.exp_avg_sq.", "optimizer.exp_avg_sq."},
                                                            {"optimizer.state.fp32_param.", "optimizer.fp32_param."}};
  const size_t n = map.size();
  bool any = false;
  for (const auto& [dist, canonical] : kKinds) {
    if (!index.tensor_index.count(std::string(canonical) + "model.norm.weight")) continue;
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
Result<std::vector<torch::DcpBytesEntry>> extra_states(const std::vector<DistTensor>& map, int64_t layers) {
  PyArena a;
  CKPT_ASSIGN_OR_RETURN(std::string none_list, torch::torch_save_bytes(a.list({a.none()})));
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

}  // namespace dist_export_detail

Status export_megatron_dist(TensorSource& src, const std::string& dst, const MegatronExportOptions& opts) {
  using namespace dist_export_detail;
  const nlohmann::json& meta = src.metadata();
  if (!meta.is_object() || !meta.contains("model_config"))
    return Status::NotFound("source '" + src.describe() +
                            "' carries no model config (config.json / manifest model_config); export-megatron needs it");
  CKPT_ASSIGN_OR_RETURN(LlamaConfig cfg, LlamaConfig::from_json(meta["model_config"]));
  if (cfg.num_hidden_layers > (1 << 20)) return Status::Unsupported("more than 2^20 layers");
  CKPT_ASSIGN_OR_RETURN(Layout layout, Layout::make(opts.tp, opts.pp, 1, 0, static_cast<int>(cfg.num_hidden_layers),
                                                    opts.layers_per_stage));
  layout.vocab_divisor = opts.vocab_divisor;
  CKPT_RETURN_IF_ERROR(LlamaShardingRules(cfg).check_layout(layout));
  if (opts.vpp < 1) return Status::InvalidArgument("export-megatron --vpp " + std::to_string(opts.vpp) + ": must be >= 1");
  // A virtual pipeline: the keys and chunks are those of its plain pipeline of pp * vpp chunk stages
  // (global layer indices, megatron_vpp.h); each chunk is written by the real rank holding it.
  Layout stages = layout;
  if (opts.vpp > 1) {
    CKPT_ASSIGN_OR_RETURN(stages, megatron_vpp_layout(layout, opts.vpp, "export-megatron --pp " + std::to_string(opts.pp) +
                                                                            " --vpp " + std::to_string(opts.vpp)));
  }
  CKPT_ASSIGN_OR_RETURN(std::vector<DistTensor> map, megatron_dist_tensors(cfg, stages));
  if (opts.vpp > 1)
    for (auto& t : map)
      for (auto& c : t.chunks) {
        const int stage = c.rank / layout.tp;
        c.rank = megatron_vpp_of_stage(layout.pp, stage).pp_rank * layout.tp + c.rank % layout.tp;
      }
  CKPT_ASSIGN_OR_RETURN(SourceIndex index, SourceIndex::build(src));
  const bool optim = add_dist_optimizer_tensors(index, map);
  // Each mcore tensor's dtype: the requested one (weights), else its first canonical tensor's.
  std::vector<DType> dtypes;
  std::vector<TensorMeta> canonical;
  for (const auto& t : map) {
    DType dt = opts.dtype.value_or(DType::kF32);
    const bool keep = !opts.dtype || t.key.rfind("optimizer.", 0) == 0;
    for (const auto& c : t.chunks)
      for (const auto& s : c.segments) {
        auto it = s.tensor.empty() ? index.tensor_index.end() : index.tensor_index.find(s.tensor);
        if (it == index.tensor_index.end()) continue;
        if (keep) dt = src.tensors()[it->second].dtype;
        canonical.push_back(src.tensors()[it->second]);
      }
    dtypes.push_back(dt);
  }
  std::sort(canonical.begin(), canonical.end(), [](const TensorMeta& a, const TensorMeta& b) { return a.name < b.name; });
  canonical.erase(std::unique(canonical.begin(), canonical.end()), canonical.end());
  std::error_code ec;
  if (std::filesystem::exists(dst, ec)) return Status::InvalidArgument("destination '" + dst + "' already exists");
  nlohmann::json args = megatron_vpp_args(megatron_args(cfg, layout), opts.vpp);
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
  CKPT_ASSIGN_OR_RETURN(std::string common, common_pt(args, iteration, step));
  CKPT_ASSIGN_OR_RETURN(auto bytes, extra_states(map, cfg.num_hidden_layers));
  const std::string md_json =
      R"({"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch", "common_backend_version": 1})";
  DistSegmentSink sink(dst, std::move(map), std::move(dtypes), std::move(bytes),
                       {{"common.pt", common}, {"metadata.json", md_json}});
  ExecOptions eo;
  eo.max_chunk_bytes = opts.chunk_bytes;
  eo.progress = opts.progress;
  eo.before_commit = opts.before_commit;
  return execute(src, sink, canonical, sink.pieces(), nlohmann::json::object(), eo);
}

}  // namespace ckpt
