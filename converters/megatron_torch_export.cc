#include "converters/megatron_torch_export.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <vector>

#include "converters/megatron_segments.h"
#include "formats/safetensors/st_reader.h"
#include "formats/torch/torch_file_writer.h"

namespace ckpt {

namespace megatron_torch_export_detail {

namespace fs = std::filesystem;
using torch::PyArena;
using torch::PyObj;

// A JSON value of the args as a Python object (scalars, lists of scalars).
const PyObj* json_to_py(PyArena& a, const nlohmann::json& v) {
  if (v.is_boolean()) return a.boolean(v.get<bool>());
  if (v.is_number_integer()) return a.integer(v.get<int64_t>());
  if (v.is_number()) return a.real(v.get<double>());
  if (v.is_string()) return a.str(v.get<std::string>());
  if (v.is_array()) {
    std::vector<const PyObj*> items;
    for (const auto& e : v) items.push_back(json_to_py(a, e));
    return a.list(std::move(items));
  }
  return a.none();
}

// argparse.Namespace(**args, params_dtype=torch.<dtype>, bf16=..., fp16=...).
const PyObj* args_namespace(PyArena& a, const nlohmann::json& args, DType dtype) {
  std::vector<std::pair<const PyObj*, const PyObj*>> kv;
  for (const auto& [k, v] : args.items()) kv.emplace_back(a.str(k), json_to_py(a, v));
  // Megatron-LM's names for an uneven pipeline split (arguments.py: --decoder-first-pipeline-num-layers).
  if (const auto it = args.find("layers_per_stage"); it != args.end() && it->is_array() && it->size() > 1) {
    kv.emplace_back(a.str("decoder_first_pipeline_num_layers"), json_to_py(a, it->front()));
    kv.emplace_back(a.str("decoder_last_pipeline_num_layers"), json_to_py(a, it->back()));
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

// Writes one rank file from its staged safetensors file.
Status write_rank(const std::string& staged, const std::string& out, const nlohmann::json& args, int64_t iteration) {
  CKPT_ASSIGN_OR_RETURN(auto sf, safetensors::SafetensorsFile::open(staged));
  PyArena a;
  std::vector<torch::TorchStorage> storages;
  std::vector<std::pair<const PyObj*, const PyObj*>> model;
  DType dtype = DType::kF32;
  for (size_t i = 0; i < sf->tensors().size(); ++i) {
    const TensorMeta& t = sf->tensors()[i];
    if (i == 0 || t.dtype != DType::kF32) dtype = t.dtype;
    CKPT_ASSIGN_OR_RETURN(const int64_t numel, shape_numel(t.shape));
    torch::TensorRef ref;
    ref.storage = {std::to_string(i), t.dtype, numel, "cpu"};
    ref.size.assign(t.shape.begin(), t.shape.end());
    ref.stride.assign(t.shape.size(), 1);
    for (size_t d = t.shape.size(); d-- > 1;) ref.stride[d - 1] = ref.stride[d] * t.shape[d];
    storages.push_back({ref.storage.key, t.dtype, ref.storage.numel});
    model.emplace_back(a.str(t.name), a.tensor(std::move(ref)));
    if (const std::string m = linear_module(t.name); !m.empty()) model.emplace_back(a.str(m + "._extra_state"), a.none());
  }
  const PyObj* root = a.dict({{a.str("args"), args_namespace(a, args, dtype)},
                              {a.str("checkpoint_version"), a.real(3.0)},
                              {a.str("iteration"), a.integer(iteration)},
                              {a.str("model"), a.ordered_dict(std::move(model))}});
  torch::TorchFileWriter w(out);
  CKPT_RETURN_IF_ERROR(w.begin(root, storages));
  for (size_t i = 0; i < sf->pieces().size(); ++i) {
    const TensorMeta& t = sf->tensors()[i];
    auto ext = sf->file_extent(i, Box::whole(t.shape));
    if (!ext) return Status::Internal("staged Megatron tensor '" + t.name + "' of '" + staged + "' has no file extent");
    if (sf->pieces()[i].tensor != t.name) return Status::Internal("staged file '" + staged + "': piece order");
    CKPT_RETURN_IF_ERROR(w.write_from_file(i, ext->fd, ext->offset, ext->bytes));
  }
  return w.commit();
}

}  // namespace megatron_torch_export_detail

Status megatron_torch_from_staging(const std::string& staging, const std::string& dst, const Layout& layout,
                                   const nlohmann::json& args, int64_t iteration) {
  namespace fs = std::filesystem;
  if (iteration < 0 || iteration > 9999999) return Status::InvalidArgument("iteration " + std::to_string(iteration) +
                                                                           " outside 0..9999999");
  std::error_code ec;
  const std::string partial = dst + ".partial";
  fs::remove_all(partial, ec);
  char iter[32];
  std::snprintf(iter, sizeof iter, "iter_%07lld", static_cast<long long>(iteration));
  for (int p = 0; p < layout.pp; ++p)
    for (int r = 0; r < layout.tp; ++r) {
      const std::string rank = megatron_rank_dir(layout, r, p);
      const std::string out_dir = partial + "/" + iter + "/" + rank;
      fs::create_directories(out_dir, ec);
      if (ec) return Status::Io("cannot create '" + out_dir + "': " + ec.message());
      Status s = megatron_torch_export_detail::write_rank(staging + "/" + rank + "/model.safetensors",
                                                          out_dir + "/model_optim_rng.pt", args, iteration);
      if (!s.ok()) {
        fs::remove_all(partial, ec);
        return s;
      }
    }
  {
    std::ofstream f(partial + "/latest_checkpointed_iteration.txt");
    f << iteration;
    if (!f.good()) return Status::Io("cannot write '" + partial + "/latest_checkpointed_iteration.txt'");
  }
  fs::rename(partial, dst, ec);
  if (ec) return Status::Io("cannot rename '" + partial + "' to '" + dst + "': " + ec.message());
  return Status::Ok();
}

}  // namespace ckpt
