#include "converters/megatron/megatron_export.h"

#include <filesystem>
#include <algorithm>
#include <map>
#include <system_error>

#include "converters/megatron/megatron_moe_args.h"
#include "converters/megatron/megatron_sink.h"
#include "converters/megatron/megatron_torch_export.h"
#include "converters/megatron/megatron_torch_optim.h"
#include "converters/megatron/megatron_vpp.h"
#include "converters/model/llama_sharding.h"
#include "formats/base/fs_util.h"
#include "reshard/executor.h"

namespace ckpt {

namespace {

// The export: layout, every rank's Megatron tensors (index pp_rank * tp + tp_rank) and the
// canonical tensors their segments read, each with its source dtype.
struct MegatronPlan {
  LlamaConfig config;
  Layout layout;
  Layout stages;  // the staged ranks' pipeline: `layout`, or with a virtual pipeline its pp * vpp chunk stages
  std::vector<std::vector<MegatronTensor>> ranks;
  std::vector<std::string> dirs;  // MoE: each rank file's directory (mp_rank_TT[_PPP]_EEE); empty: tp x pp
  std::map<std::string, TensorMeta> canonical;
};

// An MoE export (docs/MOE.md step 3, megatron_moe_export_check): the files of the stage-local ranks
// r < max(tp, ep * etp) as Megatron-LM saves them (expert data parallel rank 0), each the dense
// tensors of TP rank r % tp and the experts of EP rank (r / etp) % ep, expert TP rank r % etp.
Status plan_moe_files(const TensorSource& src, const MegatronExportOptions& opts, MegatronPlan& plan) {
  const LlamaConfig& cfg = plan.config;
  CKPT_RETURN_IF_ERROR(megatron_moe_export_check(cfg, opts.vpp, opts.dist_opt.enabled, src.tensors()));
  if (opts.format != MegatronFileFormat::kTorch)
    return Status::Error("UnsupportedModel", "export-megatron of an MoE model writes --format torch or torch_dist");
  const Layout& l = plan.layout;
  for (int p = 0; p < l.pp; ++p)
    for (int r = 0; r < std::max(l.tp, l.ep * l.expert_tp()); ++r) {
      const MegatronRankPart part{(r / l.expert_tp()) % l.ep, r % l.expert_tp(), true, true};
      CKPT_ASSIGN_OR_RETURN(auto ts, megatron_rank_tensors(cfg, l, r % l.tp, p, opts.norms, part));
      plan.ranks.push_back(std::move(ts));
      plan.dirs.push_back(megatron_rank_dir(l, r % l.tp, p, part.ep_rank));
    }
  return Status::Ok();
}

Result<MegatronPlan> plan_layout(const TensorSource& src, const MegatronExportOptions& opts) {
  const nlohmann::json& meta = src.metadata();
  if (!meta.is_object() || !meta.contains("model_config"))
    return Status::NotFound("source '" + src.describe() +
                            "' carries no model config (config.json / manifest model_config); export-megatron needs it");
  MegatronPlan plan;
  CKPT_ASSIGN_OR_RETURN(plan.config, LlamaConfig::from_json(meta["model_config"]));
  const LlamaConfig& cfg = plan.config;
  if (cfg.num_hidden_layers > (1 << 20)) return Status::Unsupported("more than 2^20 layers");
  CKPT_ASSIGN_OR_RETURN(plan.layout, megatron_export_layout(cfg, opts.tp, opts.pp, opts.ep, opts.etp, opts.layers_per_stage));
  plan.layout.vocab_divisor = opts.vocab_divisor;
  CKPT_RETURN_IF_ERROR(plan.layout.as_symmetric("export-megatron").status());
  CKPT_RETURN_IF_ERROR(LlamaShardingRules(cfg).check_layout(plan.layout));
  plan.stages = plan.layout;
  if (opts.vpp != 1) {
    if (opts.format == MegatronFileFormat::kSafetensors)
      return Status::Error("MegatronVppFormat", "export-megatron --vpp " + std::to_string(opts.vpp) +
                                                    ": --format safetensors has no model chunks; use --format torch or torch_dist");
    CKPT_ASSIGN_OR_RETURN(plan.stages, megatron_vpp_layout(plan.layout, opts.vpp,
                                                           "export-megatron --pp " + std::to_string(opts.pp) + " --vpp " +
                                                               std::to_string(opts.vpp)));
  }
  if (cfg.moe) {
    CKPT_RETURN_IF_ERROR(plan_moe_files(src, opts, plan));
    return plan;
  }
  // Every rank's tensors, computed (and refused) before anything is written.
  for (int p = 0; p < plan.stages.pp; ++p)
    for (int r = 0; r < plan.stages.tp; ++r) {
      CKPT_ASSIGN_OR_RETURN(auto ts, megatron_rank_tensors(cfg, plan.stages, r, p, opts.norms));
      plan.ranks.push_back(std::move(ts));
    }
  return plan;
}

// Every canonical tensor the segments read: present in `src` with the config's shape.
Status check_canonical(const TensorSource& src, MegatronPlan& plan) {
  CKPT_ASSIGN_OR_RETURN(SourceIndex index, SourceIndex::build(src));
  std::map<std::string, Shape> expect;
  for (const auto& t : llama_model_tensors(plan.config, DType::kF32)) {
    expect[t.name] = t.shape;
    for (const char* prefix : kMegatronOptimPrefixes) expect[prefix + t.name] = t.shape;
  }
  for (const auto& rank : plan.ranks)
    for (const auto& t : rank)
      for (const auto& sg : t.segments) {
        if (sg.tensor.empty() || plan.canonical.count(sg.tensor)) continue;
        auto it = index.tensor_index.find(sg.tensor);
        if (it == index.tensor_index.end())
          return Status::NotFound("tensor '" + sg.tensor + "' (needed for " + t.name + ") is missing from '" +
                                  src.describe() + "'")
              .with_tensor(sg.tensor);
        const TensorMeta& m = src.tensors()[it->second];
        if (m.shape != expect[sg.tensor])
          return Status::Error("ShapeMismatch",
                               "tensor '" + sg.tensor + "' in '" + src.describe() + "' has shape " +
                                   shape_to_string(m.shape) + ", the config expects " +
                                   shape_to_string(expect[sg.tensor]))
              .with_tensor(sg.tensor);
        plan.canonical[sg.tensor] = m;
      }
  return Status::Ok();
}

// The dtype of each Megatron tensor: the requested one, else its first segment's source dtype.
std::vector<std::vector<DType>> output_dtypes(const MegatronPlan& plan, const std::optional<DType>& want) {
  std::vector<std::vector<DType>> out;
  for (const auto& rank : plan.ranks) {
    out.emplace_back();
    for (const auto& t : rank) {
      DType dt = DType::kF32;
      if (t.name.rfind(kDistOptStagedPrefix, 0) == 0) {
        dt = DType::kF32;  // the distributed optimizer's buffers are fp32
      } else if (want && t.name.rfind("optimizer.", 0) != 0) {
        dt = *want;
      } else {
        for (const auto& sg : t.segments)
          if (!sg.tensor.empty()) {
            dt = plan.canonical.at(sg.tensor).dtype;
            break;
          }
      }
      out.back().push_back(dt);
    }
  }
  return out;
}

// kTorch: the optimizer kinds `src` holds (exp_avg and exp_avg_sq, fp32_param when present) become
// extra Megatron tensors <prefix><mcore name> of every rank over the canonical <prefix><HF name>.
Status add_optimizer_tensors(const TensorSource& src, MegatronPlan& plan) {
  std::vector<std::string> kinds;
  for (const char* prefix : kMegatronOptimPrefixes)
    for (const auto& t : src.tensors())
      if (t.name.rfind(prefix, 0) == 0) {
        kinds.push_back(prefix);
        break;
      }
  if (kinds.empty()) return Status::Ok();
  if (kinds[0] == kMegatronOptimPrefixes[0] && (kinds.size() < 2 || kinds[1] != kMegatronOptimPrefixes[1]))
    return one_moment_refused(src, "--format torch");
  if (kinds[0] != kMegatronOptimPrefixes[0] || kinds.size() < 2 || kinds[1] != kMegatronOptimPrefixes[1])
    return Status::Error("MegatronOptimizerMissingMoment", "source '" + src.describe() + "' holds optimizer tensors but not both "
                         "optimizer.exp_avg.* and optimizer.exp_avg_sq.* (Megatron's Adam state needs both)");
  for (auto& rank : plan.ranks) {
    const size_t n = rank.size();
    for (const std::string& prefix : kinds)
      for (size_t i = 0; i < n; ++i) {
        MegatronTensor t = rank[i];
        t.name = prefix + t.name;
        for (auto& sg : t.segments)
          if (!sg.tensor.empty()) sg.tensor = prefix + sg.tensor;
        rank.push_back(std::move(t));
      }
  }
  return Status::Ok();
}

// --dist-opt: each rank's world buffers (every bucket's [0, numel_unpadded) concatenated, per
// state) become 1-D tensors distrib_optim.<state> of the staged file, whose flat segments read the
// canonical weights / masters and moments.
// With a virtual pipeline, grad buffer c of pipeline rank p goes to the staged rank of chunk stage c * pp + p.
Status add_dist_opt_tensors(MegatronPlan& plan, const nlohmann::json& args, bool fp32_masters, const std::string& where, int vpp) {
  CKPT_ASSIGN_OR_RETURN(auto groups, dist_opt_buffers(plan.config, plan.layout, args, fp32_masters, where, vpp));
  if (groups.size() != plan.ranks.size()) return Status::Internal("dist-opt groups differ from the ranks");
  for (size_t gi = 0; gi < groups.size(); ++gi)
    for (const char* st : kDistOptStates) {
      const DistOptGroupBuffers& grp = groups[gi];
      const size_t g = static_cast<size_t>(megatron_vpp_virtual_stage(plan.layout.pp, grp.pp_rank, grp.chunk)) *
                           static_cast<size_t>(plan.layout.tp) + static_cast<size_t>(grp.tp_rank);
      if (!grp.states.count(st)) continue;  // Lion: no exp_avg_sq
      MegatronTensor t;
      t.name = std::string(kDistOptStagedPrefix) + st;
      int64_t n = 0;
      for (const auto& bucket : grp.states.at(st))
        for (const auto& sg : bucket) {
          t.segments.push_back(sg);
          n += sg.rows();
        }
      t.shape = {n};
      plan.ranks[g].push_back(std::move(t));
    }
  return Status::Ok();
}

}  // namespace

Status export_megatron(TensorSource& src, const std::string& dst, const MegatronExportOptions& opts) {
  CKPT_ASSIGN_OR_RETURN(MegatronPlan plan, plan_layout(src, opts));
  const bool torch = opts.format == MegatronFileFormat::kTorch;
  nlohmann::json optim = megatron_optimizer_fields(src.metadata());
  nlohmann::json args = megatron_vpp_args(megatron_args(plan.config, plan.layout), opts.vpp);
  if (opts.dist_opt.enabled) {
    if (!torch)
      return Status::Error("DistOptNeedsMegatronFormat",
                           "--dist-opt writes Megatron's distributed optimizer: --format torch (distrib_optim.pt) or "
                           "torch_dist (dp_reshardable), not safetensors");
    if (opts.dist_opt.sharding != "dp_reshardable")
      return Status::Error("UnsupportedDistOptim", "--dist-opt-sharding " + opts.dist_opt.sharding +
                                                       ": the legacy format (--format torch) has one form, distrib_optim.pt; "
                                                       "fully_reshardable is a torch_dist form");
    CKPT_ASSIGN_OR_RETURN(DistOptSourceState st, check_dist_opt_source(src, opts.dist_opt, opts.norms == MegatronNormNames::kLocal));
    optim["optimizer"] = st.optimizer;
    args.update(dist_opt_args(opts.dist_opt, plan.layout.tp, plan.layout.pp, optim));
    CKPT_RETURN_IF_ERROR(add_dist_opt_tensors(plan, args, st.fp32_masters, src.describe(), opts.vpp));
  } else if (torch && opts.vpp > 1) {
    for (const auto& t : src.tensors())
      if (t.name.rfind("optimizer.", 0) == 0)
        return Status::Error("MegatronVppOptimizer", "export-megatron --format torch --vpp " + std::to_string(opts.vpp) +
                                                         ": source '" + src.describe() + "' holds optimizer state ('" + t.name +
                                                         "'), which a virtual pipeline's legacy files cannot take yet; "
                                                         "use --format torch_dist").with_tensor(t.name);
  } else if (torch) {
    CKPT_RETURN_IF_ERROR(add_optimizer_tensors(src, plan));
  }
  CKPT_RETURN_IF_ERROR(check_canonical(src, plan));
  std::error_code ec;
  if (std::filesystem::exists(dst, ec)) return Status::InvalidArgument("destination '" + dst + "' already exists");
  CKPT_RETURN_IF_ERROR(remove_stale_partial(dst));  // a crashed export's leftover; a live one's is refused
  std::vector<TensorMeta> tensors;
  for (const auto& [name, m] : plan.canonical) tensors.push_back(m);
  auto dtypes = output_dtypes(plan, opts.dtype);
  const std::string out = torch ? dst + ".staging" : dst;
  if (torch) {
    CKPT_RETURN_IF_ERROR(remove_stale_partial(out));
    std::filesystem::remove_all(out, ec);
  }
  const std::vector<std::string> dirs = plan.dirs;
  MegatronSink sink(out, plan.stages, std::move(plan.ranks), std::move(dtypes), args.dump(2) + "\n", true, dirs);
  ExecOptions eo;
  eo.max_chunk_bytes = opts.chunk_bytes;
  eo.progress = opts.progress;
  eo.before_commit = opts.before_commit;
  Status s = execute(src, sink, tensors, sink.pieces(), nlohmann::json::object(), eo);
  if (s.ok() && torch) s = megatron_torch_from_staging(out, dst, plan.stages, args, opts.iteration, optim, opts.vpp,
                                                       opts.write_pool, dirs);
  if (torch) std::filesystem::remove_all(out, ec);
  return s;
}

}  // namespace ckpt
