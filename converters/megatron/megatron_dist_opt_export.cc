#include "converters/megatron/megatron_dist_opt_export.h"

#include "converters/megatron/megatron_torch_optim.h"
#include "converters/megatron/megatron_vpp.h"

namespace ckpt {

nlohmann::json megatron_optimizer_fields(const nlohmann::json& meta) {
  nlohmann::json o = nlohmann::json::object();
  if (meta.contains("megatron") && meta["megatron"].is_object()) {
    const auto& m = meta["megatron"];
    if (m.contains("optimizer_step") && m["optimizer_step"].is_number_integer()) o["step"] = m["optimizer_step"];
    if (m.contains("adam") && m["adam"].is_object())
      for (const auto& [k, v] : m["adam"].items())
        if (v.is_number()) o[k] = v;
    if (m.contains("opt_param_scheduler") && m["opt_param_scheduler"].is_object() && !m["opt_param_scheduler"].empty())
      o["opt_param_scheduler"] = m["opt_param_scheduler"];  // the imported OptimizerParamScheduler state, written back
  }
  if (meta.contains("trainer") && meta["trainer"].is_object()) {
    const auto& t = meta["trainer"];
    if (t.contains("step") && t["step"].is_number_integer()) o["step"] = t["step"];
    if (t.contains("adamw") && t["adamw"].is_object())
      for (const auto& [k, v] : t["adamw"].items())
        if (v.is_number()) o[k] = v;
    if (t.contains("lr_schedule") && t["lr_schedule"].is_object() && t["lr_schedule"].contains("peak_lr"))
      o["lr"] = t["lr_schedule"]["peak_lr"];
  }
  return o;
}

nlohmann::json dist_opt_args(const MegatronDistOptOptions& o, int tp, int pp, const nlohmann::json& optim_in) {
  const nlohmann::json optim = optim_in.is_object() ? optim_in : nlohmann::json::object();
  const std::string kind = optim.value("optimizer", std::string("adam"));
  nlohmann::json a = {{"use_distributed_optimizer", true},
                      {"data_parallel_size", o.dp},
                      {"world_size", int64_t{tp} * pp * o.dp},
                      {"ddp_bucket_size", o.bucket_size ? nlohmann::json(*o.bucket_size) : nlohmann::json(nullptr)},
                      {"overlap_grad_reduce", o.bucket_size.has_value()},
                      {"grad_reduce_in_fp32", true},
                      {"transformer_impl", "local"},
                      {"optimizer", kind}};
  const double lr = optim.value("lr", 0.0);
  a["lr"] = lr;
  a["min_lr"] = optim.value("min_lr", lr);
  a["weight_decay"] = optim.value("weight_decay", 0.0);
  if (kind == "lion") {  // OptimizerConfig's lion_beta1 / lion_beta2 (the param groups' betas)
    a["lion_beta1"] = optim.value("beta1", 0.95);
    a["lion_beta2"] = optim.value("beta2", 0.98);
    return a;
  }
  a["adam_beta1"] = optim.value("beta1", 0.9);
  a["adam_beta2"] = optim.value("beta2", 0.999);
  a["adam_eps"] = optim.value("eps", 1e-8);
  return a;
}

std::string source_optimizer(const TensorSource& src) {
  const nlohmann::json& md = src.metadata();
  if (md.is_object() && md.contains("megatron_args") && md["megatron_args"].is_object() &&
      md["megatron_args"].contains("optimizer") && md["megatron_args"]["optimizer"].is_string())
    return md["megatron_args"]["optimizer"].get<std::string>();
  return "";
}

Status one_moment_refused(const TensorSource& src, const std::string& what) {
  const std::string optim = source_optimizer(src);
  const std::string kind = optim.empty() ? " (no args.optimizer recorded)" : " (args.optimizer '" + optim + "')";
  return Status::Error("MegatronOneMomentExport",
                       what + ": source '" + src.describe() + "' holds one optimizer moment, optimizer.exp_avg.* without " +
                           "optimizer.exp_avg_sq.*" + kind +
                           ": ckpt writes a one-moment state as Lion's distributed optimizer only (--dist-opt, a source "
                           "recording args.optimizer 'lion'); otherwise Megatron's Adam state (both moments) only (ckpt's "
                           "store keeps it: reshard does; to-hf writes the weights)");
}

Result<DistOptSourceState> check_dist_opt_source(const TensorSource& src, const MegatronDistOptOptions& o, bool local_norms) {
  if (o.dp < 1 || o.dp > (int64_t{1} << 20))
    return Status::Error("DistOptBadFlag", "--dp " + std::to_string(o.dp) + ": the data-parallel size must be 1..2^20");
  if (o.bucket_size && (*o.bucket_size < 1 || *o.bucket_size > (int64_t{1} << 40)))
    return Status::Error("DistOptBadFlag", "--ddp-bucket-size " + std::to_string(*o.bucket_size) + " must be 1..2^40");
  if (o.sharding != "dp_reshardable" && o.sharding != "fully_reshardable")
    return Status::Error("UnsupportedDistOptim", "--dist-opt-sharding '" + o.sharding +
                                                     "': ckpt writes dp_reshardable and fully_reshardable");
  if (!local_norms)
    return Status::Error("DistOptNeedsLocalSpec",
                         "--dist-opt: the bucket layout follows the parameters' registration order, known for the local "
                         "spec only (transformer_impl 'local'): add --local-norms");
  bool kinds[3] = {false, false, false};
  for (const auto& t : src.tensors())
    for (int k = 0; k < 3; ++k)
      if (t.name.rfind(kMegatronOptimPrefixes[k], 0) == 0) kinds[k] = true;
  if (!kinds[0] && !kinds[1])
    return Status::Error("DistOptNoOptimizerState", "--dist-opt: source '" + src.describe() +
                                                        "' holds no optimizer state (optimizer.exp_avg.* and "
                                                        "optimizer.exp_avg_sq.*): there is nothing to write as the "
                                                        "distributed optimizer; export without --dist-opt");
  DistOptSourceState out;
  out.fp32_masters = kinds[2];
  if (kinds[0] && !kinds[1]) {  // one moment: Lion's (megatron-core's optimizer_state_keys ('exp_avg',)), which keeps no step
    if (source_optimizer(src) != "lion") return one_moment_refused(src, "--dist-opt");
    out.optimizer = "lion";
    return out;
  }
  if (!kinds[0] || !kinds[1])
    return Status::Error("MegatronOptimizerMissingMoment",
                         "--dist-opt: source '" + src.describe() + "' holds " +
                             (kinds[0] ? "optimizer.exp_avg.* but not optimizer.exp_avg_sq.*"
                                       : "optimizer.exp_avg_sq.* but not optimizer.exp_avg.*") +
                             " (Megatron's Adam state needs both)");
  if (!megatron_optimizer_fields(src.metadata()).contains("step"))
    return Status::Error("DistOptNoStep", "--dist-opt: source '" + src.describe() +
                                              "' records no optimizer step (megatron.optimizer_step or trainer.step): "
                                              "Adam's bias correction needs it");
  return out;
}

Result<std::vector<DistOptGroupBuffers>> dist_opt_buffers(const LlamaConfig& cfg, const Layout& layout, const nlohmann::json& args, bool fp32_masters,
                                                          const std::string& where, int vpp) {
  std::vector<DistOptGroupBuffers> out;
  Layout stages = layout;
  if (vpp > 1) {
    CKPT_ASSIGN_OR_RETURN(stages, megatron_vpp_layout(layout, vpp, where));
  }
  for (int p = 0; p < layout.pp; ++p)
    for (int r = 0; r < layout.tp; ++r)
      for (int c = 0; c < std::max(1, vpp); ++c) {
        CKPT_ASSIGN_OR_RETURN(DistOptimGroup grp, dist_optim_group(cfg, stages, args, where, r, c * layout.pp + p, vpp));
        DistOptGroupBuffers g;
        g.tp_rank = r, g.pp_rank = p, g.group = p * layout.tp + r, g.chunk = c;
        for (const auto& b : grp.layout.buckets) {
          g.numel.push_back(b.end - b.start);
          g.numel_unpadded.push_back(b.numel_unpadded);
        }
        g.states["param"] = dist_optim_bucket_segments(grp, [&](const std::string& w) { return fp32_masters ? kMegatronOptimPrefixes[2] + w : w; });
        g.states["exp_avg"] = dist_optim_bucket_segments(grp, [](const std::string& w) { return kMegatronOptimPrefixes[0] + w; });
        if (args.value("optimizer", std::string("adam")) != "lion")  // M1: Lion keeps exp_avg only
          g.states["exp_avg_sq"] = dist_optim_bucket_segments(grp, [](const std::string& w) { return kMegatronOptimPrefixes[1] + w; });
        out.push_back(std::move(g));
      }
  return out;
}

const torch::PyObj* megatron_param_group(torch::PyArena& a, const nlohmann::json& adam, bool no_decay,
                                         std::optional<std::vector<const torch::PyObj*>> ids) {
  const double lr = adam.value("lr", 0.0);
  std::vector<std::pair<const torch::PyObj*, const torch::PyObj*>> kv = {
      {a.str("is_expert_parallel"), a.boolean(false)},
      {a.str("default_config"), a.boolean(true)},
      {a.str("wd_mult"), a.real(no_decay ? 0.0 : 1.0)},
      {a.str("lr_mult"), a.real(1.0)},
      {a.str("is_decoupled_lr"), a.boolean(false)},
      {a.str("max_lr"), a.real(adam.value("max_lr", lr))},
      {a.str("min_lr"), a.real(adam.value("min_lr", 0.0))},
      {a.str("lr"), a.real(lr)}};
  if (adam.value("optimizer", std::string("adam")) == "lion") {  // emerging_optimizers' Lion: betas, weight_decay; no step
    kv.emplace_back(a.str("betas"), a.tuple({a.real(adam.value("beta1", 0.95)), a.real(adam.value("beta2", 0.98))}));
    kv.emplace_back(a.str("weight_decay"), a.real(adam.value("weight_decay", 0.0)));
    if (ids) kv.emplace_back(a.str("params"), a.list(std::move(*ids)));
    return a.dict(std::move(kv));
  }
  kv.insert(kv.end(), {
      {a.str("betas"), a.tuple({a.real(adam.value("beta1", 0.9)), a.real(adam.value("beta2", 0.999))})},
      {a.str("eps"), a.real(adam.value("eps", 1e-8))},
      {a.str("weight_decay"), a.real(adam.value("weight_decay", 0.0))},
      {a.str("amsgrad"), a.boolean(false)},
      {a.str("maximize"), a.boolean(false)},
      {a.str("foreach"), a.none()},
      {a.str("capturable"), a.boolean(false)},
      {a.str("differentiable"), a.boolean(false)},
      {a.str("fused"), a.none()},
      {a.str("decoupled_weight_decay"), a.boolean(true)}});
  if (ids) kv.emplace_back(a.str("params"), a.list(std::move(*ids)));
  else kv.emplace_back(a.str("step"), a.real(static_cast<double>(adam.value("step", int64_t{0}))));
  return a.dict(std::move(kv));
}

const torch::PyObj* dist_opt_param_groups(torch::PyArena& a, const nlohmann::json& optim) {
  return a.dict({{a.str("param_groups"), a.list({megatron_param_group(a, optim, false, std::nullopt),
                                                 megatron_param_group(a, optim, true, std::nullopt)})}});
}

const torch::PyObj* dist_opt_dtype_key(torch::PyArena& a, DType param_dtype) {
  return a.tuple({a.record(torch::torch_dtype_name(param_dtype), nullptr, nullptr),
                  a.record(torch::torch_dtype_name(DType::kF32), nullptr, nullptr)});
}

}  // namespace ckpt
