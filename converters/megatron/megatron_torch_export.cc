#include "converters/megatron/megatron_torch_export.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <system_error>
#include <vector>

#include "converters/megatron/megatron_dist_opt_export.h"
#include "converters/megatron/megatron_segments.h"
#include "converters/megatron/megatron_torch_optim.h"
#include "converters/megatron/megatron_vpp.h"
#include "formats/base/fs_util.h"
#include "formats/safetensors/st_reader.h"
#include "formats/torch/pickle/py_json.h"
#include "formats/torch/torch_file_writer.h"

namespace ckpt {

namespace megatron_torch_export_detail {

namespace fs = std::filesystem;
using torch::PyArena;
using torch::PyObj;

// argparse.Namespace(**args, params_dtype=torch.<dtype>, bf16=..., fp16=...).
const PyObj* args_namespace(PyArena& a, const nlohmann::json& args, DType dtype) {
  std::vector<std::pair<const PyObj*, const PyObj*>> kv;
  for (const auto& [k, v] : args.items()) kv.emplace_back(a.str(k), torch::json_to_pyobj(a, v));
  // Megatron-LM's names for an uneven pipeline split (arguments.py: --decoder-first-pipeline-num-layers).
  if (const auto it = args.find("layers_per_stage"); it != args.end() && it->is_array() && it->size() > 1) {
    kv.emplace_back(a.str("decoder_first_pipeline_num_layers"), torch::json_to_pyobj(a, it->front()));
    kv.emplace_back(a.str("decoder_last_pipeline_num_layers"), torch::json_to_pyobj(a, it->back()));
  }
  kv.emplace_back(a.str("params_dtype"), a.record(torch::torch_dtype_name(dtype), nullptr, nullptr));
  kv.emplace_back(a.str("bf16"), a.boolean(dtype == DType::kBF16));
  kv.emplace_back(a.str("fp16"), a.boolean(dtype == DType::kF16));
  return a.record("argparse.Namespace", a.tuple({}), a.dict(std::move(kv)), true);
}

// The module of a Megatron linear layer's weight ("...linear_qkv" of "...linear_qkv.weight"), or "".
std::string linear_module(const std::string& name) {
  for (const char* m : {".linear_qkv.weight", ".linear_proj.weight", ".linear_fc1.weight", ".linear_fc2.weight"})
    if (name.size() > std::string(m).size() && name.compare(name.size() - std::string(m).size(), std::string::npos, m) == 0)
      return name.substr(0, name.size() - 7);
  if (name == "output_layer.weight") return "output_layer";
  return "";
}

// A dense tensor over the whole storage `key`.
torch::TensorRef dense_ref(const std::string& key, DType dtype, const Shape& shape, int64_t numel) {
  torch::TensorRef ref;
  ref.storage = {key, dtype, numel, "cpu"};
  ref.size.assign(shape.begin(), shape.end());
  ref.stride.assign(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) ref.stride[d - 1] = ref.stride[d] * shape[d];
  return ref;
}

bool has_prefix(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

// What one rank file holds: the staged tensors by name (index into the staged file), the model
// parameters in mcore named_parameters order, and the storages the pickle names (a staged tensor
// gets one on first use; each step tensor its own).
struct RankContent {
  const safetensors::SafetensorsFile* sf = nullptr;
  size_t key_base = 0;  // storage keys from here (a virtual pipeline's chunks share the file's keys)
  std::map<std::string, size_t> staged;       // name -> staged tensor index
  std::vector<std::string> params;            // model tensor names, mcore order
  std::vector<torch::TorchStorage> storages;
  std::map<size_t, size_t> storage_of_staged;  // staged index -> storage index
  std::vector<std::pair<size_t, float>> steps;  // (storage index, value)

  DType dtype_of(const std::string& n) const { return sf->tensors()[staged.at(n)].dtype; }
  // The tensor object of staged tensor `name`.
  const PyObj* tensor(PyArena& a, const std::string& name) {
    const size_t i = staged.at(name);
    const TensorMeta& t = sf->tensors()[i];
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    auto [it, fresh] = storage_of_staged.emplace(i, storages.size());
    if (fresh) storages.push_back({std::to_string(key_base + it->second), t.dtype, numel});
    return a.tensor(dense_ref(std::to_string(key_base + it->second), t.dtype, t.shape, numel));
  }
  const PyObj* step(PyArena& a, float value) {
    const size_t k = storages.size();
    storages.push_back({std::to_string(key_base + k), DType::kF32, 1});
    steps.emplace_back(k, value);
    return a.tensor(dense_ref(std::to_string(key_base + k), DType::kF32, {}, 1));
  }
};

// The 'optimizer' entry (converters/megatron/megatron_torch_optim.h): FP32Optimizer's AdamW state_dict, or
// Float16OptimizerWithFloat16Params' {'optimizer', 'fp32_from_fp16_params'} when `masters` (a
// master per non-fp32 parameter). nullptr when the staged file does not hold both moments (and
// the masters) of every parameter (export_megatron stages all or none).
const PyObj* optimizer_entry(PyArena& a, RankContent& rc, const nlohmann::json& optim, bool masters) {
  const std::string avg = kMegatronOptimPrefixes[0], sq = kMegatronOptimPrefixes[1], fp32 = kMegatronOptimPrefixes[2];
  if (rc.params.empty()) return nullptr;
  for (const auto& n : rc.params)
    if (!rc.staged.count(avg + n) || !rc.staged.count(sq + n) ||
        (masters && rc.dtype_of(n) != DType::kF32 && !rc.staged.count(fp32 + n)))
      return nullptr;
  std::vector<const PyObj*> ids[2], master_lists[2];
  std::vector<std::pair<const PyObj*, const PyObj*>> state;
  std::vector<std::string> order[2];
  for (const auto& n : rc.params)
    order[megatron_no_weight_decay(n, rc.sf->tensors()[rc.staged.at(n)].shape)].push_back(n);
  int64_t id = 0;
  const float step = static_cast<float>(optim.value("step", int64_t{0}));
  for (int kind = 0; kind < 2; ++kind)
    for (const auto& n : order[kind]) {
      const PyObj* st = rc.step(a, step);
      const PyObj* m1 = rc.tensor(a, avg + n);
      const PyObj* m2 = rc.tensor(a, sq + n);
      state.emplace_back(a.integer(id), a.dict({{a.str("step"), st}, {a.str("exp_avg"), m1}, {a.str("exp_avg_sq"), m2}}));
      ids[kind].push_back(a.integer(id++));
    }
  const PyObj* adam = a.dict({{a.str("state"), a.dict(std::move(state))},
                              {a.str("param_groups"), a.list({megatron_param_group(a, optim, false, std::move(ids[0])),
                                                              megatron_param_group(a, optim, true, std::move(ids[1]))})}});
  if (!masters) return adam;
  for (int kind = 0; kind < 2; ++kind)
    for (const auto& n : order[kind])
      if (rc.dtype_of(n) != DType::kF32) master_lists[kind].push_back(rc.tensor(a, fp32 + n));
  return a.dict({{a.str("optimizer"), adam},
                 {a.str("fp32_from_fp16_params"), a.list({a.list(std::move(master_lists[0])), a.list(std::move(master_lists[1]))})}});
}

// <dir>/distrib_optim.pt from the staged world buffers distrib_optim.<state> of each model chunk's
// staged file (the layout of converters/megatron/megatron_distrib_optim.h, what save_parameter_state
// writes): {'buckets_coalesced': True, c: {(torch.<dtype>, torch.float32): {'param', 'exp_avg',
// 'exp_avg_sq' (Lion: no exp_avg_sq), 'numel_unpadded'}}}, grad buffer c = model chunk c.
Status write_distrib_optim(const std::vector<RankContent>& chunks, const std::vector<std::unique_ptr<safetensors::SafetensorsFile>>& files,
                           const std::string& out, DType param_dtype, const torch::TorchWriteOptions& wo) {
  PyArena a;
  std::vector<torch::TorchStorage> storages;
  std::vector<std::pair<const PyObj*, const PyObj*>> root = {{a.str("buckets_coalesced"), a.boolean(true)}};
  std::vector<std::pair<safetensors::SafetensorsFile*, size_t>> order;
  for (size_t c = 0; c < chunks.size(); ++c) {
    safetensors::SafetensorsFile& sf = *files[c];
    std::vector<std::pair<const PyObj*, const PyObj*>> state;
    int64_t numel = -1;
    for (const char* st : kDistOptStates) {
      auto it = chunks[c].staged.find(std::string(kDistOptStagedPrefix) + st);
      if (it == chunks[c].staged.end() && std::string(st) == "exp_avg_sq") continue;  // Lion keeps exp_avg only
      if (it == chunks[c].staged.end()) return Status::Internal("staged file: no world buffer '" + std::string(st) + "'");
      const TensorMeta& t = sf.tensors()[it->second];
      if (t.shape.size() != 1 || t.dtype != DType::kF32 || (numel >= 0 && t.shape[0] != numel))
        return Status::Internal("staged world buffer '" + t.name + "' is not 1-D fp32 of one size");
      numel = t.shape[0];
      storages.push_back({std::to_string(storages.size()), DType::kF32, numel});
      state.emplace_back(a.str(st), a.tensor(dense_ref(storages.back().key, DType::kF32, t.shape, numel)));
      order.emplace_back(&sf, it->second);
    }
    state.emplace_back(a.str("numel_unpadded"), a.integer(numel));
    root.emplace_back(a.integer(static_cast<int64_t>(c)), a.dict({{dist_opt_dtype_key(a, param_dtype), a.dict(std::move(state))}}));
  }
  torch::TorchFileWriter w(out, wo);
  CKPT_RETURN_IF_ERROR(w.begin(a.dict(std::move(root)), storages));
  for (size_t k = 0; k < order.size(); ++k) {
    const auto& [sf, i] = order[k];
    const TensorMeta& t = sf->tensors()[i];
    auto ext = sf->file_extent(i, Box::whole(t.shape));
    if (!ext) return Status::Internal("staged world buffer '" + t.name + "' has no file extent");
    CKPT_RETURN_IF_ERROR(w.write_from_file(k, ext->fd, ext->offset, ext->bytes));
  }
  return w.commit();
}

// Writes one rank file from its staged safetensors files: one ('model'), or with a virtual
// pipeline one per chunk ('model0' .. 'model{v-1}', weights only).
Status write_rank(const std::vector<std::string>& staged, const std::string& out, const nlohmann::json& args,
                  int64_t iteration, const nlohmann::json& optim, const torch::TorchWriteOptions& wo) {
  PyArena a;
  std::vector<std::unique_ptr<safetensors::SafetensorsFile>> files;
  std::vector<RankContent> rcs(staged.size());
  std::vector<torch::TorchStorage> storages;
  std::vector<std::pair<const PyObj*, const PyObj*>> models;
  DType dtype = DType::kF32;
  bool first = true;
  for (size_t c = 0; c < staged.size(); ++c) {
    CKPT_ASSIGN_OR_RETURN(auto sf, safetensors::SafetensorsFile::open(staged[c]));
    RankContent& rc = rcs[c];
    rc.sf = sf.get();
    rc.key_base = storages.size();
    for (size_t i = 0; i < sf->tensors().size(); ++i) {
      const TensorMeta& t = sf->tensors()[i];
      if (sf->pieces()[i].tensor != t.name) return Status::Internal("staged file '" + staged[c] + "': piece order");
      CKPT_RETURN_IF_ERROR(shape_numel(t.shape).status());
      rc.staged[t.name] = i;
      if (has_prefix(t.name, "optimizer.") || has_prefix(t.name, kDistOptStagedPrefix)) continue;
      rc.params.push_back(t.name);
      if (first || t.dtype != DType::kF32) dtype = t.dtype;
      first = false;
    }
    std::sort(rc.params.begin(), rc.params.end(), megatron_param_order_less);
    std::vector<std::pair<const PyObj*, const PyObj*>> model;
    for (const auto& n : rc.params) {
      model.emplace_back(a.str(n), rc.tensor(a, n));
      if (const std::string m = linear_module(n); !m.empty()) model.emplace_back(a.str(m + "._extra_state"), a.none());
    }
    const std::string key = staged.size() == 1 ? "model" : "model" + std::to_string(c);
    models.emplace_back(a.str(key), a.ordered_dict(std::move(model)));
    const bool dist_opt = rc.staged.count(std::string(kDistOptStagedPrefix) + kDistOptStates[0]) > 0;
    if (staged.size() == 1 && !dist_opt) {  // the optimizer entry takes storages after the model's
      bool masters = false;
      for (const auto& n : rc.params)
        masters = masters || (rc.dtype_of(n) != DType::kF32 && rc.staged.count(kMegatronOptimPrefixes[2] + n) > 0);
      if (const PyObj* o = optimizer_entry(a, rc, optim, masters)) models.emplace_back(a.str("optimizer"), o);
    }
    storages.insert(storages.end(), rc.storages.begin(), rc.storages.end());
    files.push_back(std::move(sf));
  }
  if (rcs.front().staged.count(std::string(kDistOptStagedPrefix) + kDistOptStates[0])) {
    // DistributedOptimizer.state_dict(): the param groups; the state is in distrib_optim.pt (one grad buffer per chunk)
    models.emplace_back(a.str("optimizer"), a.dict({{a.str("optimizer"), dist_opt_param_groups(a, optim)}}));
    CKPT_RETURN_IF_ERROR(write_distrib_optim(rcs, files, fs::path(out).parent_path().string() + "/distrib_optim.pt", dtype, wo));
  }
  // Megatron-LM saves the scheduler beside the optimizer: the imported one, written back as read
  if (!models.empty() && models.back().first->is(torch::PyType::kStr) && models.back().first->s == "optimizer" &&
      optim.contains("opt_param_scheduler"))
    models.emplace_back(a.str("opt_param_scheduler"), torch::json_to_pyobj(a, optim["opt_param_scheduler"]));
  std::vector<std::pair<const PyObj*, const PyObj*>> root = {{a.str("args"), args_namespace(a, args, dtype)},
                                                             {a.str("checkpoint_version"), a.real(3.0)},
                                                             {a.str("iteration"), a.integer(iteration)}};
  root.insert(root.end(), models.begin(), models.end());
  torch::TorchFileWriter w(out, wo);
  CKPT_RETURN_IF_ERROR(w.begin(a.dict(std::move(root)), std::move(storages)));
  for (size_t c = 0; c < rcs.size(); ++c) {
    const RankContent& rc = rcs[c];
    for (const auto& [i, k] : rc.storage_of_staged) {
      const TensorMeta& t = rc.sf->tensors()[i];
      auto ext = files[c]->file_extent(i, Box::whole(t.shape));
      if (!ext) return Status::Internal("staged Megatron tensor '" + t.name + "' of '" + staged[c] + "' has no file extent");
      CKPT_RETURN_IF_ERROR(w.write_from_file(rc.key_base + k, ext->fd, ext->offset, ext->bytes));
    }
    for (const auto& [k, v] : rc.steps) CKPT_RETURN_IF_ERROR(w.write(rc.key_base + k, &v, sizeof(float)));
  }
  return w.commit();
}

}  // namespace megatron_torch_export_detail

Status megatron_torch_from_staging(const std::string& staging, const std::string& dst, const Layout& layout,
                                   const nlohmann::json& args, int64_t iteration, const nlohmann::json& optim, int vpp,
                                   WritePool* write_pool, const std::vector<std::string>& rank_dirs) {
  torch::TorchWriteOptions wo;
  wo.write_pool = write_pool;
  namespace fs = std::filesystem;
  if (iteration < 0 || iteration > 9999999) return Status::InvalidArgument("iteration " + std::to_string(iteration) +
                                                                           " outside 0..9999999");
  std::error_code ec;
  // Built under the one commit mechanism (locked against a second writer, a stale leftover replaced).
  PartialDir dir(dst, PartialDirPolicy{.replace_stale = true, .empty_target_ok = false});
  CKPT_RETURN_IF_ERROR(dir.create());
  const std::string partial = dir.path();
  char iter[32];
  std::snprintf(iter, sizeof iter, "iter_%07lld", static_cast<long long>(iteration));
  if (vpp < 1 || layout.pp % vpp != 0) return Status::Internal("staged pipeline of " + std::to_string(layout.pp) +
                                                               " stages for vpp " + std::to_string(vpp));
  const int pp = layout.pp / vpp;  // the staged stages are the chunks (megatron_vpp.h)
  Layout real = layout;
  real.pp = pp;
  for (const std::string& rank : rank_dirs) {
    const std::string out_dir = partial + "/" + iter + "/" + rank;
    fs::create_directories(out_dir, ec);
    if (ec) return Status::Io("cannot create '" + out_dir + "': " + ec.message());
    CKPT_RETURN_IF_ERROR(megatron_torch_export_detail::write_rank({staging + "/" + rank + "/model.safetensors"},
                                                                  out_dir + "/model_optim_rng.pt", args, iteration, optim, wo));
  }
  for (int p = 0; p < pp && rank_dirs.empty(); ++p)
    for (int r = 0; r < layout.tp; ++r) {
      const std::string rank = megatron_rank_dir(real, r, p);
      const std::string out_dir = partial + "/" + iter + "/" + rank;
      fs::create_directories(out_dir, ec);
      if (ec) return Status::Io("cannot create '" + out_dir + "': " + ec.message());
      std::vector<std::string> staged;
      for (int c = 0; c < vpp; ++c)
        staged.push_back(staging + "/" + megatron_rank_dir(layout, r, megatron_vpp_virtual_stage(pp, p, c)) +
                         "/model.safetensors");
      Status s = megatron_torch_export_detail::write_rank(staged, out_dir + "/model_optim_rng.pt", args, iteration, optim, wo);
      if (!s.ok()) return s;  // ~PartialDir removes the partial output
    }
  {
    std::ofstream f(partial + "/latest_checkpointed_iteration.txt");
    f << iteration;
    if (!f.good()) return Status::Io("cannot write '" + partial + "/latest_checkpointed_iteration.txt'");
  }
  return dir.commit(/*fsync=*/true);
}

}  // namespace ckpt
