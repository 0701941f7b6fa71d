#include "converters/megatron/megatron_torch_optim.h"

#include <algorithm>
#include <cstring>
#include <map>

namespace ckpt {

namespace megatron_optim_detail {

using torch::PyObj;
using torch::PyType;

constexpr size_t kMaxOptimParams = size_t{1} << 22;  // ids of one rank's optimizer

Status optim_error(const char* code, const std::string& file, const std::string& msg) {
  return Status::Error(code, "'" + file + "': optimizer " + msg).with_file(file);
}

bool py_number(const PyObj* v, double& out) {
  if (v == nullptr) return false;
  if (v->is(PyType::kFloat)) out = v->f;
  else if (v->is(PyType::kInt)) out = static_cast<double>(v->i);
  else return false;
  return true;
}

// The value of integer key `id` of a dict, or nullptr.
const PyObj* dict_at_int(const PyObj* d, int64_t id) {
  for (const auto& [k, v] : d->entries)
    if (k->is(PyType::kInt) && k->i == id) return v;
  return nullptr;
}

// A step value: an int, a float, or a one-element tensor (torch keeps a float32 0-dim tensor).
Result<int64_t> read_step(torch::TorchFile& file, const PyObj* v, const std::string& where) {
  double d = 0;
  if (py_number(v, d)) return static_cast<int64_t>(d);
  if (v == nullptr || !v->is(PyType::kTensor))
    return optim_error("MegatronOptimizerState", file.path(), where + " 'step' is not a number or a tensor");
  const torch::TensorRef& t = v->tensor;
  int64_t n = 1;
  for (int64_t s : t.size) n *= s;
  const size_t es = dtype_size(t.storage.dtype);
  if (n != 1 || (t.storage.dtype != DType::kF32 && t.storage.dtype != DType::kF64 && t.storage.dtype != DType::kI64))
    return optim_error("MegatronOptimizerState", file.path(), where + " 'step' is not a one-element f32/f64/i64 tensor");
  unsigned char buf[8] = {};
  CKPT_RETURN_IF_ERROR(file.read_storage(t.storage.key, static_cast<uint64_t>(t.storage_offset) * es, es, buf));
  if (t.storage.dtype == DType::kF32) { float f; std::memcpy(&f, buf, 4); return static_cast<int64_t>(f); }
  if (t.storage.dtype == DType::kF64) { double f; std::memcpy(&f, buf, 8); return static_cast<int64_t>(f); }
  int64_t i; std::memcpy(&i, buf, 8); return i;
}

// A moment / master tensor of parameter `p`: present, a tensor, of the parameter's shape.
Result<const torch::TensorRef*> param_tensor(const std::string& file, const PyObj* v, const MegatronModelParam& p,
                                             const std::string& what) {
  if (v == nullptr)
    return optim_error("MegatronOptimizerMissingMoment", file, "state of '" + p.name + "' has no '" + what + "'");
  if (!v->is(PyType::kTensor))
    return optim_error("MegatronOptimizerState", file, "'" + what + "' of '" + p.name + "' is a " +
                                                          py_type_name(v->type) + ", not a tensor");
  const Shape got(v->tensor.size.begin(), v->tensor.size.end());
  if (got != p.shape)
    return Status::Error("ShapeMismatch", "'" + file + "': optimizer '" + what + "' of '" + p.name + "' has shape " +
                                              shape_to_string(got) + ", the parameter " + shape_to_string(p.shape))
        .with_file(file).with_tensor(p.name);
  if (!dtype_is_float(v->tensor.storage.dtype))
    return optim_error("MegatronOptimizerState", file, "'" + what + "' of '" + p.name + "' is " +
                                                          std::string(dtype_name(v->tensor.storage.dtype)));
  return &v->tensor;
}

// id -> parameter index, from the groups' params lists and kinds (see the header).
Result<std::map<int64_t, size_t>> map_ids(const std::string& file, const PyObj* groups,
                                          const std::vector<MegatronModelParam>& params) {
  std::vector<size_t> of_kind[2];  // [no_decay] -> parameter indices in model order
  for (size_t i = 0; i < params.size(); ++i) of_kind[megatron_no_weight_decay(params[i].name, params[i].shape)].push_back(i);
  std::map<int64_t, size_t> id_to_param;
  bool used[2] = {false, false};
  for (size_t g = 0; g < groups->items.size(); ++g) {
    const PyObj* grp = groups->items[g];
    const std::string where = "param_groups[" + std::to_string(g) + "]";
    if (!grp->is(PyType::kDict)) return optim_error("MegatronOptimizerState", file, where + " is not a dict");
    const PyObj* ids = grp->get("params");
    if (ids == nullptr || !ids->is(PyType::kList) || ids->items.size() > kMaxOptimParams)
      return optim_error("MegatronOptimizerState", file, where + " has no 'params' list of ids");
    if (ids->items.empty()) continue;
    double wd = 1;
    if (!py_number(grp->get("wd_mult"), wd))
      return optim_error("MegatronOptimizerState", file, where + " has no number 'wd_mult'");
    const int kind = wd == 0 ? 1 : 0;
    if (used[kind])
      return Status::Unsupported("'" + file + "': optimizer " + where + " is a second non-empty group of " +
                                 (kind ? "no-weight-decay" : "weight-decay") +
                                 " parameters (decoupled LR or other overrides): its parameter order is not known")
          .with_file(file);
    used[kind] = true;
    if (ids->items.size() != of_kind[kind].size())
      return optim_error("MegatronOptimizerParams", file, where + " (" + (kind ? "wd_mult 0: 1-dim and bias" : "weight decay") +
                                                              ") lists " + std::to_string(ids->items.size()) +
                                                              " parameters, the model has " +
                                                              std::to_string(of_kind[kind].size()) + " of that kind");
    for (size_t k = 0; k < ids->items.size(); ++k) {
      const PyObj* id = ids->items[k];
      if (!id->is(PyType::kInt) || !id_to_param.emplace(id->i, of_kind[kind][k]).second)
        return optim_error("MegatronOptimizerState", file, where + " 'params' holds a non-integer or repeated id");
    }
  }
  for (int kind = 0; kind < 2; ++kind)
    if (!used[kind] && !of_kind[kind].empty())
      return optim_error("MegatronOptimizerParams", file, "has no param group for the " + std::to_string(of_kind[kind].size()) +
                                                              " model parameters of " +
                                                              (kind ? "the no-weight-decay kind, e.g. '" : "the weight-decay kind, e.g. '") +
                                                              params[of_kind[kind][0]].name + "'");
  return id_to_param;
}

// lr, betas, eps, weight_decay of the first weight-decay group (else the first group).
nlohmann::json adam_hyper(const PyObj* groups) {
  nlohmann::json j = nlohmann::json::object();
  const PyObj* pick = nullptr;
  for (const PyObj* g : groups->items) {
    if (!g->is(PyType::kDict)) continue;
    double wd = 1;
    py_number(g->get("wd_mult"), wd);
    if (wd != 0) {
      pick = g;
      break;
    }
    if (pick == nullptr) pick = g;
  }
  if (pick == nullptr) return j;
  double v = 0;
  for (const char* k : {"lr", "min_lr", "max_lr", "eps", "weight_decay"})
    if (py_number(pick->get(k), v)) j[k] = v;
  if (const PyObj* b = pick->get("betas"); b != nullptr && (b->is(PyType::kTuple) || b->is(PyType::kList)) && b->items.size() == 2) {
    double b1 = 0, b2 = 0;
    if (py_number(b->items[0], b1) && py_number(b->items[1], b2)) j["beta1"] = b1, j["beta2"] = b2;
  }
  return j;
}

// The fp32 masters of Float16OptimizerWithFloat16Params: list g holds one per non-fp32 parameter
// of group g, in group order; an fp32 parameter is its own master.
Status add_masters(const std::string& file, const PyObj* masters, const PyObj* groups,
                   const std::map<int64_t, size_t>& id_to_param, const std::vector<MegatronModelParam>& params,
                   MegatronLegacyOptim& out) {
  if (!masters->is(PyType::kList) || masters->items.size() != groups->items.size())
    return optim_error("MegatronOptimizerParams", file, "'fp32_from_fp16_params' is not a list of one list per param group");
  for (size_t g = 0; g < groups->items.size(); ++g) {
    const PyObj* ids = groups->items[g]->get("params");
    const PyObj* ms = masters->items[g];
    std::vector<const MegatronModelParam*> half;
    for (const PyObj* id : ids->items) {
      const MegatronModelParam& p = params[id_to_param.at(id->i)];
      if (p.dtype != DType::kF32) half.push_back(&p);
      else if (p.ref != nullptr) out.tensors.push_back({std::string(kMegatronOptimPrefixes[2]) + p.name, p.ref});
    }
    if (!ms->is(PyType::kList) || ms->items.size() != half.size())
      return optim_error("MegatronOptimizerParams", file, "'fp32_from_fp16_params'[" + std::to_string(g) + "] holds " +
                                                              std::to_string(ms->is(PyType::kList) ? ms->items.size() : 0) +
                                                              " masters, its group has " + std::to_string(half.size()) +
                                                              " non-fp32 parameters");
    for (size_t k = 0; k < half.size(); ++k) {
      CKPT_ASSIGN_OR_RETURN(const torch::TensorRef* ref, param_tensor(file, ms->items[k], *half[k], "fp32_from_fp16_params"));
      out.tensors.push_back({std::string(kMegatronOptimPrefixes[2]) + half[k]->name, ref});
    }
  }
  return Status::Ok();
}

// exp_avg / exp_avg_sq of every parameter, and the common step.
Status add_moments(torch::TorchFile& file, const PyObj* state, const PyObj* groups,
                   const std::map<int64_t, size_t>& id_to_param, const std::vector<MegatronModelParam>& params,
                   MegatronLegacyOptim& out) {
  const std::string& path = file.path();
  for (const auto& [k, v] : state->entries)
    if (!k->is(PyType::kInt) || !id_to_param.count(k->i))
      return optim_error("MegatronOptimizerUnknownParam", path, "'state' holds an entry for parameter id " +
                                                                   (k->is(PyType::kInt) ? std::to_string(k->i) : "(not an int)") +
                                                                   " that no param group lists");
  for (const auto& [id, pi] : id_to_param) {
    const MegatronModelParam& p = params[pi];
    const PyObj* s = dict_at_int(state, id);
    if (s == nullptr || !s->is(PyType::kDict))
      return optim_error("MegatronOptimizerMissingMoment", path, "'state' has no entry for parameter id " +
                                                                    std::to_string(id) + " ('" + p.name + "')");
    for (int m = 0; m < 2; ++m) {
      const char* key = m == 0 ? "exp_avg" : "exp_avg_sq";
      CKPT_ASSIGN_OR_RETURN(const torch::TensorRef* ref, param_tensor(path, s->get(key), p, key));
      out.tensors.push_back({std::string(kMegatronOptimPrefixes[m]) + p.name, ref});
    }
    if (const PyObj* st = s->get("step"); st != nullptr) {
      CKPT_ASSIGN_OR_RETURN(const int64_t step, read_step(file, st, "state of '" + p.name + "'"));
      if (out.step && *out.step != step)
        return optim_error("MegatronOptimizerStep", path, "'" + p.name + "' is at step " + std::to_string(step) +
                                                             ", other parameters at " + std::to_string(*out.step));
      out.step = step;
    }
  }
  if (!out.step)  // TransformerEngine / Apex FusedAdam: the step lives in the param group
    for (const PyObj* g : groups->items)
      if (const PyObj* st = g->get("step"); st != nullptr) {
        CKPT_ASSIGN_OR_RETURN(out.step, read_step(file, st, "param group"));
        break;
      }
  return Status::Ok();
}

}  // namespace megatron_optim_detail

bool megatron_no_weight_decay(const std::string& name, const Shape& shape) {
  return shape.size() == 1 || (name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0);
}

nlohmann::json megatron_adam_hyper(const torch::PyObj* groups) {
  if (groups == nullptr || !groups->is(torch::PyType::kList)) return nlohmann::json::object();
  return megatron_optim_detail::adam_hyper(groups);
}

Result<MegatronLegacyOptim> megatron_legacy_optimizer(torch::TorchFile& file, const std::vector<MegatronModelParam>& params) {
  using namespace megatron_optim_detail;
  MegatronLegacyOptim out;
  const std::string& path = file.path();
  const PyObj* opt = file.root()->get("optimizer");
  if (opt == nullptr || opt->is(PyType::kNone)) return out;
  if (opt->is(PyType::kList)) {
    out.not_imported = "a ChainedOptimizer of " + std::to_string(opt->items.size()) + " optimizers (a list of state dicts)";
    return out;
  }
  if (!opt->is(PyType::kDict)) return optim_error("MegatronOptimizerState", path, "entry is not a dict");
  const PyObj* adam = opt;
  const PyObj* masters = nullptr;
  if (const PyObj* inner = opt->get("optimizer"); inner != nullptr && inner->is(PyType::kDict)) {
    adam = inner;
    masters = opt->get("fp32_from_fp16_params");
  }
  const PyObj* groups = adam->get("param_groups");
  if (groups == nullptr || !groups->is(PyType::kList))
    return optim_error("MegatronOptimizerState", path, "has no 'param_groups' list (not a torch optimizer state_dict)");
  out.adam = adam_hyper(groups);
  for (const PyObj* g : groups->items)
    if (g->is(PyType::kDict) && g->get("wd_mult") == nullptr) {
      out.not_imported = "param groups without 'wd_mult' (not built by megatron-core's _get_param_groups): "
                         "which id is which parameter is not known";
      return out;
    }
  const PyObj* state = adam->get("state");
  if (state == nullptr) {
    out.not_imported = "no per-parameter 'state' (the distributed optimizer keeps it in distrib_optim.pt)";
    for (const PyObj* g : groups->items)  // its step: the param groups' (DistributedOptimizer.state_dict())
      if (const PyObj* st = g->is(PyType::kDict) ? g->get("step") : nullptr; st != nullptr) {
        CKPT_ASSIGN_OR_RETURN(out.step, read_step(file, st, "param group"));
        break;
      }
    return out;
  }
  if (!state->is(PyType::kDict)) return optim_error("MegatronOptimizerState", path, "'state' is not a dict");
  CKPT_ASSIGN_OR_RETURN(auto id_to_param, map_ids(path, groups, params));
  if (state->entries.empty()) {
    out.not_imported = "the optimizer state is empty (no step taken)";
    return out;
  }
  CKPT_RETURN_IF_ERROR(add_moments(file, state, groups, id_to_param, params, out));
  if (masters != nullptr && !masters->is(PyType::kNone))
    CKPT_RETURN_IF_ERROR(add_masters(path, masters, groups, id_to_param, params, out));
  return out;
}

namespace {

// (layer index or -1 / INT_MAX, module position) of an mcore parameter name.
std::pair<int64_t, int> mcore_param_position(const std::string& n) {
  if (n.rfind("embedding.", 0) == 0) return {-1, 0};
  if (n.rfind("decoder.final_layernorm.", 0) == 0) return {INT64_MAX, 0};
  if (n.rfind("output_layer.", 0) == 0) return {INT64_MAX, 1};
  const std::string pre = "decoder.layers.";
  if (n.rfind(pre, 0) != 0) return {INT64_MAX, 2};
  const size_t dot = n.find('.', pre.size());
  int64_t layer = 0;
  for (size_t i = pre.size(); i < dot && i < n.size(); ++i) layer = layer * 10 + (n[i] - '0');
  const std::string rest = dot == std::string::npos ? "" : n.substr(dot + 1);
  // TransformerLayer registers input_layernorm, self_attention (linear_proj before linear_qkv:
  // Attention.__init__ then SelfAttention), pre_mlp_layernorm, mlp (linear_fc1, linear_fc2).
  static const char* const kOrder[] = {"input_layernorm.weight", "self_attention.linear_proj.weight",
                                       "self_attention.linear_proj.bias", "self_attention.linear_qkv.layer_norm_weight",
                                       "self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias",
                                       "pre_mlp_layernorm.weight", "mlp.linear_fc1.layer_norm_weight",
                                       "mlp.linear_fc1.weight", "mlp.linear_fc1.bias", "mlp.linear_fc2.weight",
                                       "mlp.linear_fc2.bias"};
  for (int i = 0; i < static_cast<int>(std::size(kOrder)); ++i)
    if (rest == kOrder[i]) return {layer, i};
  return {layer, static_cast<int>(std::size(kOrder))};
}

}  // namespace

bool megatron_param_order_less(const std::string& a, const std::string& b) {
  const auto pa = mcore_param_position(a), pb = mcore_param_position(b);
  if (pa != pb) return pa < pb;
  return a < b;
}

}  // namespace ckpt

namespace ckpt {

nlohmann::json torch_adam_hyper(const torch::PyObj* param_groups) {
  if (param_groups == nullptr || !(param_groups->is(torch::PyType::kList) || param_groups->is(torch::PyType::kTuple)))
    return nlohmann::json::object();
  return megatron_optim_detail::adam_hyper(param_groups);
}

}  // namespace ckpt
