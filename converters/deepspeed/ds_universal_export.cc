#include "converters/deepspeed/ds_universal_export.h"

#include <filesystem>
#include <map>

#include "converters/deepspeed/ds_universal_sink.h"
#include "converters/megatron/megatron_dist_opt_export.h"
#include "converters/model/llama_config.h"
#include "converters/megatron/megatron_torch_optim.h"
#include "formats/base/fs_util.h"
#include "formats/torch/torch_file_writer.h"

namespace ckpt {

namespace fs = std::filesystem;
using torch::PyArena;
using torch::PyObj;

namespace {

constexpr int kParamGroupCopies = 8;  // stages 1/2 zip the engine's param groups with the file's

bool is_model_tensor(const std::string& n) { return n.rfind("optimizer.", 0) != 0 && !n.ends_with(".rotary_emb.inv_freq"); }

// A parameter name is a directory name under zero/: no '/', NUL, "." or "..", not empty, at most 255 bytes.
Status check_param_name(const std::string& n) {
  if (!n.empty() && n != "." && n != ".." && n.size() <= 255 && n.find('/') == std::string::npos && n.find('\0') == std::string::npos)
    return Status::Ok();
  return Status::Error("DeepSpeedParamName", "parameter name '" + n.substr(0, 64) +
                                                 "' cannot be a directory under zero/ (empty, '.', '..', a '/', NUL or over 255 bytes)")
      .with_tensor(n);
}

Status check_shape(const TensorMeta& t, const TensorMeta& w) {
  if (t.shape == w.shape) return Status::Ok();
  return Status::Error("ShapeMismatch", "'" + t.name + "' has shape " + shape_to_string(t.shape) + ", its weight '" + w.name + "' " +
                                            shape_to_string(w.shape)).with_tensor(t.name);
}

// The moments (and fp32 master) of every weight, or none: adds their copies to `plan`.
Status plan_states(const std::map<std::string, const TensorMeta*>& by_name, DsUniversalPlan& plan, bool weights_only) {
  size_t with = 0;
  std::string missing;
  for (const std::string& p : plan.params) {
    const bool has = by_name.count(kMegatronOptimPrefixes[0] + p) && by_name.count(kMegatronOptimPrefixes[1] + p);
    with += has;
    if (!has && missing.empty()) missing = p;
  }
  if (with == 0 && !weights_only)
    return Status::Error("DeepSpeedNoOptimizerState",
                         "the source holds no Adam state (optimizer.exp_avg.* / optimizer.exp_avg_sq.*): a universal checkpoint "
                         "resumes training with it. Pass --weights-only to write zero moments and step 0, the state a new Adam starts from");
  if (with != 0 && with != plan.params.size())
    return Status::Error("DeepSpeedPartialOptimizerState", "the source holds Adam moments for " + std::to_string(with) + " of " +
                                                                std::to_string(plan.params.size()) + " parameters ('" + missing +
                                                                "' has none): a universal checkpoint needs them for every parameter")
        .with_tensor(missing);
  plan.fresh_adam = with == 0;
  for (size_t i = 0; i < plan.params.size(); ++i) {
    const std::string& p = plan.params[i];
    const TensorMeta& w = *by_name.at(p);
    auto add = [&](const std::string& src, const char* state) -> Status {
      const TensorMeta& t = *by_name.at(src);
      CKPT_RETURN_IF_ERROR(check_shape(t, w));
      if (!dtype_is_float(t.dtype))
        return Status::Error("DeepSpeedNotFloat", "'" + src + "' is " + std::string(dtype_name(t.dtype)) + ", expected a float tensor")
            .with_tensor(src);
      plan.copy.tensors.push_back({src, DType::kF32, t.shape});
      plan.copy.pieces.push_back({src, Region{Box::whole(t.shape)}, DType::kF32});
      plan.files.push_back(p + "/" + state + ".pt");
      plan.copy.total_bytes += static_cast<uint64_t>(Box::whole(t.shape).numel()) * 4;
      return Status::Ok();
    };
    const std::string master = kMegatronOptimPrefixes[2] + p;
    CKPT_RETURN_IF_ERROR(add(by_name.count(master) ? master : p, "fp32"));
    if (plan.fresh_adam) continue;
    CKPT_RETURN_IF_ERROR(add(kMegatronOptimPrefixes[0] + p, "exp_avg"));
    CKPT_RETURN_IF_ERROR(add(kMegatronOptimPrefixes[1] + p, "exp_avg_sq"));
  }
  return Status::Ok();
}

const PyObj* torch_size(PyArena& a, const Shape& s) {
  std::vector<const PyObj*> dims;
  for (int64_t d : s) dims.push_back(a.integer(d));
  return a.record("torch.Size", a.tuple({a.tuple(std::move(dims))}), nullptr);
}

// The step as the optimizer keeps it: a float32 0-d tensor in storage "0" (`storages` gets it), or an int.
const PyObj* step_obj(PyArena& a, const DsUniversalPlan& plan, bool int_step, std::vector<torch::TorchStorage>& storages) {
  if (int_step) return a.integer(plan.step);
  storages.push_back({"0", DType::kF32, 1});
  torch::TensorRef ref;
  ref.storage = {"0", DType::kF32, 1, "cpu"};
  return a.tensor(std::move(ref));
}

Status write_small(const std::string& path, const PyObj* root, const std::vector<torch::TorchStorage>& storages, float step,
                   const torch::TorchWriteOptions& wo) {
  std::vector<const void*> data(storages.size(), &step);
  return torch::write_torch_file(path, root, storages, data, wo);
}

Status write_model_states(const std::string& dir, const DsUniversalPlan& plan, const torch::TorchWriteOptions& wo) {
  PyArena a;
  std::vector<std::pair<const PyObj*, const PyObj*>> shapes;
  for (size_t i = 0; i < plan.params.size(); ++i) shapes.emplace_back(a.str(plan.params[i]), torch_size(a, plan.shapes[i]));
  const PyObj* root = a.dict({
      {a.str("module"), a.ordered_dict({})}, {a.str("buffer_names"), a.list({})}, {a.str("optimizer"), a.none()},
      {a.str("param_shapes"), a.list({a.ordered_dict(std::move(shapes))})}, {a.str("frozen_param_shapes"), a.ordered_dict({})},
      {a.str("shared_params"), a.dict({})}, {a.str("frozen_param_fragments"), a.ordered_dict({})}, {a.str("lr_scheduler"), a.none()},
      {a.str("data_sampler"), a.none()}, {a.str("random_ltd"), a.none()}, {a.str("skipped_steps"), a.integer(0)},
      {a.str("global_steps"), a.integer(plan.global_steps)}, {a.str("global_samples"), a.integer(0)},
      {a.str("dp_world_size"), a.integer(1)}, {a.str("mp_world_size"), a.integer(1)},
      {a.str("checkpoint_parallel_dimensions"), a.dict({{a.str("pp_degree"), a.integer(1)}, {a.str("tp_degree"), a.integer(1)}})},
      {a.str("ds_version"), a.str(plan.ds_version)}});
  for (const char* f : {"mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt"})
    CKPT_RETURN_IF_ERROR(torch::write_torch_file(dir + "/" + f, root, {}, {}, wo));
  return Status::Ok();
}

Status write_optimizer_state(const std::string& zero, const DsUniversalPlan& plan, bool int_step, const torch::TorchWriteOptions& wo) {
  PyArena a;
  std::vector<std::pair<const PyObj*, const PyObj*>> g;
  if (plan.adam.contains("lr")) g.emplace_back(a.str("lr"), a.real(plan.adam["lr"].get<double>()));
  if (plan.adam.contains("beta1") && plan.adam.contains("beta2"))
    g.emplace_back(a.str("betas"), a.tuple({a.real(plan.adam["beta1"].get<double>()), a.real(plan.adam["beta2"].get<double>())}));
  if (plan.adam.contains("eps")) g.emplace_back(a.str("eps"), a.real(plan.adam["eps"].get<double>()));
  g.emplace_back(a.str("params"), a.list({a.integer(0)}));
  const PyObj* group = a.dict(std::move(g));
  std::vector<torch::TorchStorage> storages;
  const PyObj* step = step_obj(a, plan, int_step, storages);
  const PyObj* root = a.dict({{a.str("ds_version"), a.str(plan.ds_version)},
                              {a.str("param_groups"), a.list(std::vector<const PyObj*>(kParamGroupCopies, group))},
                              {a.str("optimizer_state_dict"),
                               a.dict({{a.str("state"), a.dict({{a.integer(0), a.dict({{a.str("step"), step}})}})},
                                       {a.str("param_groups"), a.list({group})}})}});
  return write_small(zero + "/optimizer_state.pt", root, storages, static_cast<float>(plan.step), wo);
}

// Everything beside the streamed tensors: zero moments (fresh Adam), step.pt, the model states,
// zero/optimizer_state.pt, latest_universal.
Status write_side_files(const std::string& root_dir, const DsUniversalPlan& plan, const DsUniversalOptions& o,
                        const torch::TorchWriteOptions& wo) {
  const std::string dir = root_dir + "/" + plan.tag, zero = dir + "/zero";
  PyArena a;
  std::vector<torch::TorchStorage> storages;
  const PyObj* step = step_obj(a, plan, o.int_step, storages);
  for (size_t i = 0; i < plan.params.size(); ++i) {
    const std::string pdir = zero + "/" + plan.params[i];
    if (plan.fresh_adam)
      for (const char* m : {"exp_avg", "exp_avg_sq"}) CKPT_RETURN_IF_ERROR(write_ds_universal_zeros(pdir + "/" + m + ".pt", plan.shapes[i], wo));
    CKPT_RETURN_IF_ERROR(write_small(pdir + "/step.pt", step, storages, static_cast<float>(plan.step), wo));
  }
  CKPT_RETURN_IF_ERROR(write_optimizer_state(zero, plan, o.int_step, wo));
  CKPT_RETURN_IF_ERROR(write_model_states(dir, plan, wo));
  return write_file(root_dir + "/latest_universal", plan.tag, o.fsync);
}

}  // namespace

nlohmann::json ds_universal_optimizer_fields(const nlohmann::json& meta) {
  nlohmann::json o = megatron_optimizer_fields(meta);
  if (meta.contains("adam") && meta["adam"].is_object())
    for (const auto& [k, v] : meta["adam"].items())
      if (v.is_number() && !o.contains(k)) o[k] = v;
  if (meta.contains("deepspeed") && meta["deepspeed"].is_object()) {
    const auto& d = meta["deepspeed"];
    if (d.contains("optimizer_step") && d["optimizer_step"].is_number_integer()) o["step"] = d["optimizer_step"];
    if (d.contains("global_steps") && d["global_steps"].is_number_integer()) o["global_steps"] = d["global_steps"];
    if (d.contains("ds_version") && d["ds_version"].is_string()) o["ds_version"] = d["ds_version"];
  }
  return o;
}

Result<DsUniversalPlan> plan_ds_universal(const TensorSource& src, const DsUniversalOptions& o) {
  DsUniversalPlan plan;
  // An MoE model's stacked experts are not the module's parameters (docs/MOE.md): refused by name.
  if (const nlohmann::json& m = src.metadata(); m.contains("model_config") && m["model_config"].is_object())
    if (auto cfg = LlamaConfig::from_json(m["model_config"]); cfg.ok()) CKPT_RETURN_IF_ERROR(cfg->require_dense("export-deepspeed"));
  std::map<std::string, const TensorMeta*> by_name;
  for (const TensorMeta& t : src.tensors()) by_name[t.name] = &t;
  for (const TensorMeta& t : src.tensors()) {
    if (!is_model_tensor(t.name)) continue;
    if (!dtype_is_float(t.dtype))
      return Status::Error("DeepSpeedNotFloat", "weight '" + t.name + "' is " + std::string(dtype_name(t.dtype)) +
                                                    ", expected a float tensor (name the source's profile if it stores floats as integers)")
          .with_tensor(t.name);
    CKPT_RETURN_IF_ERROR(check_param_name(t.name));
    plan.params.push_back(t.name);
    plan.shapes.push_back(t.shape);
  }
  if (plan.params.empty()) return Status::InvalidArgument("the source holds no model weights");
  CKPT_RETURN_IF_ERROR(plan_states(by_name, plan, o.weights_only));
  const nlohmann::json f = ds_universal_optimizer_fields(src.metadata());
  for (const char* k : {"lr", "beta1", "beta2", "eps"})
    if (f.contains(k) && f[k].is_number()) plan.adam[k] = f[k].get<double>();
  if (plan.fresh_adam) {
    plan.step = 0;
  } else if (o.step) {
    plan.step = *o.step;
  } else if (f.contains("step") && f["step"].is_number_integer()) {
    plan.step = f["step"].get<int64_t>();
  } else {
    return Status::Error("DeepSpeedNoStep", "the source holds Adam moments but records no Adam step (its bias correction needs it): "
                                            "pass --step N");
  }
  plan.global_steps = f.contains("global_steps") && f["global_steps"].is_number_integer() ? f["global_steps"].get<int64_t>() : plan.step;
  plan.ds_version = f.contains("ds_version") ? f["ds_version"].get<std::string>() : o.ds_version;
  plan.tag = "global_step" + std::to_string(plan.global_steps);
  return plan;
}

Status run_ds_universal(TensorSource& src, const DsUniversalPlan& plan, const std::string& out, const DsUniversalOptions& o) {
  PartialDir partial(out);
  CKPT_RETURN_IF_ERROR(partial.create());
  const std::string zero = partial.path() + "/" + plan.tag + "/zero";
  std::error_code ec;
  for (const std::string& p : plan.params)
    if (fs::create_directories(zero + "/" + p, ec); ec) return Status::FromErrno("mkdir", zero + "/" + p, ec.value());
  torch::TorchWriteOptions wo;
  wo.fsync = o.fsync;
  wo.io = o.io;
  std::vector<std::string> paths;
  for (const std::string& f : plan.files) paths.push_back(zero + "/" + f);
  DsUniversalSink sink(std::move(paths), wo);
  wo.io = IoMode::kBuffered;  // the side files are small
  std::function<Status()> side = [&]() -> Status {
    CKPT_RETURN_IF_ERROR(write_side_files(partial.path(), plan, o, wo));
    return o.before_commit ? o.before_commit() : Status::Ok();
  };
  CKPT_RETURN_IF_ERROR(execute_export_plan(src, sink, plan.copy, o.threads, o.max_chunk_bytes, o.progress, side));
  return partial.commit(o.fsync);
}

}  // namespace ckpt
