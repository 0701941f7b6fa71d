#include "converters/megatron/megatron_torch_source.h"

#include "converters/megatron/megatron_torch_rank_file.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <system_error>
#include <utility>
#include <vector>

#include "converters/megatron/megatron_rank_source.h"
#include "converters/megatron/megatron_segments.h"
#include "converters/megatron/megatron_distrib_optim.h"
#include "converters/megatron/megatron_moe_args.h"
#include "converters/megatron/megatron_torch_optim.h"
#include "converters/megatron/megatron_vpp.h"
#include "formats/torch/torch_file.h"

namespace ckpt {

namespace megatron_torch_detail {

namespace fs = std::filesystem;
using torch::PyObj;
using torch::PyType;

constexpr size_t kMaxArgsEntries = 4096;   // keys of the args Namespace
constexpr size_t kMaxArgsString = 4096;    // bytes of one string arg kept
constexpr size_t kMaxArgsList = 1024;      // elements of one list arg kept

Status bad_args(const std::string& file, const std::string& msg) {
  return Status::Error("BadMegatronArgs", "'" + file + "': " + msg).with_file(file);
}

// One scalar (or list of scalars) of the args as JSON; false when the value is of a kind ckpt
// does not keep (objects, nested containers, long strings): it is left out.
bool arg_to_json(const PyObj* v, nlohmann::json& out, int depth = 0) {
  switch (v->type) {
    case PyType::kNone: out = nullptr; return true;
    case PyType::kBool: out = v->b; return true;
    case PyType::kInt: out = v->i; return true;
    case PyType::kFloat: out = v->f; return true;
    case PyType::kStr:
      if (v->s.size() > kMaxArgsString) return false;
      out = v->s;
      return true;
    case PyType::kRecord:  // torch dtypes: params_dtype = torch.bfloat16
      if (v->args != nullptr || v->state != nullptr || v->cls.rfind("torch.", 0) != 0) return false;
      out = v->cls;
      return true;
    case PyType::kList:
    case PyType::kTuple: {
      if (depth > 0 || v->items.size() > kMaxArgsList) return false;
      out = nlohmann::json::array();
      for (const PyObj* e : v->items) {
        nlohmann::json x;
        if (!arg_to_json(e, x, depth + 1)) return false;
        out.push_back(std::move(x));
      }
      return true;
    }
    default: return false;
  }
}

// The args Namespace of a rank file as a JSON object (the scalar fields).
Result<nlohmann::json> args_json(const PyObj* root, const std::string& file) {
  const PyObj* args = root->get("args");
  if (args == nullptr) return bad_args(file, "the checkpoint has no 'args' entry (Megatron's argparse.Namespace)");
  if (!args->is_record("argparse.Namespace"))
    return bad_args(file, "'args' is " + std::string(args->type == PyType::kRecord ? args->cls : py_type_name(args->type)) +
                              ", expected argparse.Namespace");
  const PyObj* st = args->state;
  if (st != nullptr && st->is(PyType::kTuple) && !st->items.empty()) st = st->items[0];
  if (st == nullptr || !st->is(PyType::kDict)) return bad_args(file, "'args' Namespace has no attribute dict");
  if (st->entries.size() > kMaxArgsEntries)
    return bad_args(file, "'args' has " + std::to_string(st->entries.size()) + " attributes, more than " +
                              std::to_string(kMaxArgsEntries));
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : st->entries) {
    if (!k->is(PyType::kStr)) return bad_args(file, "'args' holds a non-string attribute name");
    nlohmann::json x;
    if (arg_to_json(v, x)) j[k->s] = std::move(x);
  }
  return j;
}

// Older Megatron-LM names -> mcore names (the segment map's), in order.
constexpr std::pair<const char*, const char*> kLegacyRenames[] = {
    {"language_model.embedding.word_embeddings.weight", "embedding.word_embeddings.weight"},
    {"language_model.output_layer.weight", "output_layer.weight"},
    {"language_model.encoder.final_norm.", "decoder.final_layernorm."},
    {"language_model.encoder.final_layernorm.", "decoder.final_layernorm."},
    {"language_model.encoder.layers.", "decoder.layers."},
    {"language_model.transformer.final_layernorm.", "decoder.final_layernorm."},
    {"language_model.transformer.layers.", "decoder.layers."},
    {".input_norm.", ".input_layernorm."},
    {".self_attention.query_key_value.", ".self_attention.linear_qkv."},
    {".self_attention.dense.", ".self_attention.linear_proj."},
    {".post_attention_norm.", ".pre_mlp_layernorm."},
    {".post_attention_layernorm.", ".pre_mlp_layernorm."},
    {".mlp.dense_h_to_4h.", ".mlp.linear_fc1."},
    {".mlp.dense_4h_to_h.", ".mlp.linear_fc2."},
};

// The iteration dir of `path`: the one latest_checkpointed_iteration.txt names, or `path`.
Result<std::string> iteration_dir(const std::string& path) {
  const std::string tracker = path + "/latest_checkpointed_iteration.txt";
  std::error_code ec;
  if (!fs::is_regular_file(tracker, ec)) return path;
  std::ifstream in(tracker);
  std::string text(64, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\r')) text.pop_back();
  if (text == "release") return path + "/release";
  if (text.empty() || text.size() > 12 || !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return Status::Error("BadMegatronArgs", "'" + tracker + "' holds '" + text.substr(0, 32) +
                                                "', expected an iteration number or 'release'").with_file(tracker);
  char buf[32];
  std::snprintf(buf, sizeof buf, "iter_%07lld", std::stoll(text));
  return path + "/" + buf;
}

// Local layer count of a rank file: 1 + the largest N of decoder.layers.N.
int64_t local_layers(const TensorSource& f) {
  int64_t n = 0;
  const std::string pre = "decoder.layers.";
  for (const auto& t : f.tensors())
    if (t.name.rfind(pre, 0) == 0) {
      const size_t dot = t.name.find('.', pre.size());
      const std::string num = t.name.substr(pre.size(), dot - pre.size());
      if (!num.empty() && num.size() < 8 && std::all_of(num.begin(), num.end(), [](char c) { return c >= '0' && c <= '9'; }))
        n = std::max<int64_t>(n, std::stoll(num) + 1);
    }
  return n;
}

// expert_model_parallel_size of the args (checked again by megatron_moe_from_args).
int args_ep(const nlohmann::json& j) {
  const auto it = j.find("expert_model_parallel_size");
  return it != j.end() && it->is_number_integer() && it->get<int64_t>() >= 1 && it->get<int64_t>() <= (1 << 16)
             ? static_cast<int>(it->get<int64_t>()) : 1;
}

// tp and pp of the args (checked again, with the rest, by megatron_args_from_json).
std::pair<int, int> args_tp_pp(const nlohmann::json& j) {
  auto get = [&](const char* k) {
    return j.contains(k) && j[k].is_number_integer() && j[k].get<int64_t>() >= 1 && j[k].get<int64_t>() <= (1 << 16)
               ? static_cast<int>(j[k].get<int64_t>()) : 1;
  };
  return {get("tensor_model_parallel_size"), get("pipeline_model_parallel_size")};
}

// The megatron metadata entry: iteration, checkpoint_version, scheduler state (scalars), the
// optimizer's step and Adam hyper-parameters (or why its state was not imported).
nlohmann::json megatron_meta(const PyObj* root, const MegatronLegacyOptim& optim, const std::string& iter_dir) {
  nlohmann::json m = {{"format", "torch"}, {"iteration_dir", iter_dir}};
  for (const char* k : {"iteration", "checkpoint_version", "num_floating_point_operations_so_far"}) {
    nlohmann::json x;
    if (const PyObj* v = root->get(k); v != nullptr && arg_to_json(v, x)) m[k] = x;
  }
  if (!optim.not_imported.empty()) m["optimizer_not_imported"] = optim.not_imported;
  if (optim.step) m["optimizer_step"] = *optim.step;
  if (!optim.adam.empty() && optim.not_imported.empty()) m["adam"] = optim.adam;  // per-parameter state or distrib_optim.pt read
  if (const PyObj* s = root->get("opt_param_scheduler"); s != nullptr && s->is(PyType::kDict)) {
    nlohmann::json sj = nlohmann::json::object();
    for (const auto& [k, v] : s->entries) {
      nlohmann::json x;
      if (k->is(PyType::kStr) && sj.size() < kMaxArgsEntries && arg_to_json(v, x)) sj[k->s] = x;
    }
    m["opt_param_scheduler"] = sj;
  }
  return m;
}

// A virtual pipeline's rank files (converters/megatron/megatron_vpp.h): chunk c of pipeline rank p is
// stage c * pp + p of a plain pipeline of pp * vpp even stages, read through the same segment map.
// The args must agree with the files (virtual_pipeline_model_parallel_size, an even split) and
// every chunk must hold num_layers / (pp * vpp) layers. Metadata: megatron.virtual_pipeline = vpp
// and no layout (a layout cannot say interleaved chunks, as for torch_dist).
Result<std::unique_ptr<TensorSource>> open_vpp(const std::string& path, nlohmann::json j,
                                               std::vector<std::unique_ptr<TorchRankFile>> files,
                                               std::vector<std::string> paths, nlohmann::json meta) {
  const std::string& first = paths.front();
  const int vpp = files.front()->chunks();
  if (const auto it = j.find("virtual_pipeline_model_parallel_size"); it != j.end() && !it->is_null() &&
                                                                        (!it->is_number_integer() || it->get<int64_t>() != vpp))
    return Status::Error("MegatronVppChunkCountMismatch", "'" + first + "': args.virtual_pipeline_model_parallel_size = " +
                                                              it->dump().substr(0, 32) + " but the file holds " +
                                                              std::to_string(vpp) + " model chunks (model0 .. model" +
                                                              std::to_string(vpp - 1) + ")")
        .with_file(first);
  for (const char* k : {"decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                        "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage",
                        "pipeline_model_parallel_layout"})
    if (j.contains(k) && !j[k].is_null())
      return Status::Error("MegatronVppUneven", "'" + first + "': args." + k + " = " + j[k].dump().substr(0, 64) +
                                                    " with a virtual pipeline: only Megatron's even interleaving "
                                                    "(num_layers / (pp * vpp) layers per chunk) is read")
          .with_file(first);
  CKPT_ASSIGN_OR_RETURN(MegatronArgs a, megatron_args_from_json(std::move(j), first));
  const int tp = a.layout.tp, pp = a.layout.pp;
  CKPT_ASSIGN_OR_RETURN(Layout virt, megatron_vpp_layout(a.layout, vpp, "'" + first + "'"));
  const int64_t per_chunk = a.config.num_hidden_layers / (int64_t{pp} * vpp);
  std::vector<std::shared_ptr<TorchRankFile>> shared;
  for (auto& f : files) shared.push_back(std::move(f));
  MegatronRankFiles ranks;
  ranks.integrity = shared.front()->integrity();
  for (int s = 0; s < pp * vpp; ++s)
    for (int r = 0; r < tp; ++r) {
      const VppChunk at = megatron_vpp_of_stage(pp, s);
      const size_t fi = static_cast<size_t>(at.pp_rank) * tp + r;
      auto view = std::make_unique<TorchChunkView>(shared[fi], at.chunk);
      const std::string name = paths[fi] + " (model" + std::to_string(at.chunk) + ")";
      if (const int64_t n = local_layers(*view); n != per_chunk)
        return Status::Error("MegatronVppLayerCountMismatch",
                             "'" + name + "' holds " + std::to_string(n) + " layer(s); " +
                                 std::to_string(a.config.num_hidden_layers) + " layers interleaved over pp " +
                                 std::to_string(pp) + " x vpp " + std::to_string(vpp) + " give each chunk " +
                                 std::to_string(per_chunk))
            .with_file(paths[fi]).with_tensor("model" + std::to_string(at.chunk));
      ranks.files.push_back(std::move(view));
      ranks.paths.push_back(name);
    }
  a.layout = std::move(virt);
  meta["megatron"]["virtual_pipeline"] = vpp;
  meta["layout"] = nullptr;  // removed by open_megatron_ranks
  return open_megatron_ranks(path, std::move(a), std::move(ranks), std::move(meta));
}

// An MoE run's rank files (docs/MOE.md step 3): the ranks of expert data parallel rank 0 save, so
// mp_rank_TT[_PPP]_EEE holds TP rank TT's dense tensors and EP rank EEE's experts. Stage-local rank
// r < max(tp, ep * etp) is TP rank r % tp, EP rank (r / etp) % ep, expert TP rank r % etp
// (Megatron-Core's order); each TP rank's dense part and each expert rank's experts are read from
// the first file holding them.
Result<std::unique_ptr<TensorSource>> open_moe(const std::string& path, nlohmann::json j, std::unique_ptr<TorchRankFile> f0,
                                               const Layout& names, nlohmann::json meta, const std::string& dir) {
  const std::string first = dir + "/" + megatron_rank_dir(names, 0, 0, 0) + "/model_optim_rng.pt";
  if (f0->chunks() != 1)
    return Status::Error("UnsupportedModel", "'" + first + "': a virtual pipeline of an MoE model is not read").with_file(first);
  // moe_grouped_gemm: TEGroupedMLP's names are read (linear_fc1.weight{j}), GroupedMLP's weight1 / weight2 not.
  bool te_grouped = false;
  for (const auto& t : f0->tensors()) te_grouped = te_grouped || t.name.find(".mlp.experts.linear_fc1.weight0") != std::string::npos;
  if (j.contains("moe_grouped_gemm") && j["moe_grouped_gemm"] == true && !te_grouped)
    return Status::Error("UnsupportedModel", "'" + first + "': Megatron-Core MoE with moe_grouped_gemm and no TEGroupedMLP "
                                             "names (mlp.experts.linear_fc1.weight0): GroupedMLP's legacy weight1 / weight2 "
                                             "are not read (its torch_dist form is; docs/MOE.md)")
        .with_file(first);
  const int tp = names.tp, pp = names.pp, ep = names.ep;
  const auto et = j.find("expert_tensor_parallel_size");
  const int etp = et != j.end() && et->is_number_integer() && et->get<int64_t>() >= 1 && et->get<int64_t>() <= (1 << 16)
                      ? static_cast<int>(et->get<int64_t>()) : tp;
  MegatronRankFiles ranks;
  std::vector<int> per_stage;
  for (int p = 0; p < pp; ++p) {
    std::set<int> dense;
    std::set<std::pair<int, int>> experts;
    for (int r = 0; r < std::max(tp, ep * etp); ++r) {
      MegatronFilePart fp{r % tp, p, {(r / etp) % ep, r % etp, false, false, te_grouped}};
      fp.part.dense = dense.insert(fp.tp_rank).second;
      fp.part.experts = experts.insert({fp.part.ep_rank, fp.part.etp_rank}).second;
      if (!fp.part.dense && !fp.part.experts) continue;
      const std::string f = dir + "/" + megatron_rank_dir(names, fp.tp_rank, p, fp.part.ep_rank) + "/model_optim_rng.pt";
      std::unique_ptr<TorchRankFile> rf;
      if (f == first && f0) {
        rf = std::move(f0);
      } else {
        CKPT_ASSIGN_OR_RETURN(rf, TorchRankFile::open(f));
      }
      if (rf->chunks() != 1)
        return Status::Error("UnsupportedModel", "'" + f + "': a virtual pipeline of an MoE model is not read").with_file(f);
      if (fp.tp_rank == 0 && fp.part.dense) per_stage.push_back(static_cast<int>(local_layers(*rf)));
      ranks.files.push_back(std::move(rf));
      ranks.paths.push_back(f);
      ranks.parts.push_back(fp);
    }
  }
  if (pp > 1) j["layers_per_stage"] = per_stage;
  ranks.integrity = ranks.files.front()->integrity();
  CKPT_ASSIGN_OR_RETURN(MegatronArgs a, megatron_args_from_json(std::move(j), first));
  return open_megatron_ranks(path, std::move(a), std::move(ranks), std::move(meta));
}

Result<std::unique_ptr<TensorSource>> open_dir(const std::string& path_in) {
  std::string path = path_in;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  CKPT_ASSIGN_OR_RETURN(const std::string dir, iteration_dir(path));
  std::error_code ec;
  std::string first_dir;  // mp_rank_00, _000 (pp or ep), _000_000 (pp and ep)
  for (const char* d : {"mp_rank_00", "mp_rank_00_000", "mp_rank_00_000_000"})
    if (first_dir.empty() && fs::is_directory(dir + "/" + d, ec)) first_dir = d;
  // A run dir whose iteration holds DCP data (torch_dist) but no metadata.json: the torch_dist
  // detection passed it by (metadata.json is what marks a complete torch_dist save).
  if (first_dir.empty()) {
    bool dcp = fs::is_regular_file(dir + "/.metadata", ec) || fs::is_regular_file(dir + "/common.pt", ec);
    for (fs::directory_iterator it(dir, ec), end; !dcp && !ec && it != end; it.increment(ec)) dcp = it->path().extension() == ".distcp";
    if (dcp)
      return Status::Error("IncompleteCheckpoint", "'" + dir + "' holds Megatron-Core torch_dist data (.metadata / .distcp / common.pt) but " +
                                                       (fs::is_regular_file(dir + "/.metadata", ec)
                                                            ? "no metadata.json, which Megatron-Core writes last"
                                                            : "neither .metadata nor metadata.json") +
                                                       ": the save did not complete")
          .with_file(dir + "/metadata.json");
    first_dir = "mp_rank_00";
  }
  const std::string first = dir + "/" + first_dir + "/model_optim_rng.pt";
  CKPT_ASSIGN_OR_RETURN(auto f0, TorchRankFile::open(first));
  CKPT_ASSIGN_OR_RETURN(nlohmann::json j, args_json(f0->root(), first));
  const auto [tp, pp] = args_tp_pp(j);
  Layout names;
  names.tp = tp;
  names.pp = pp;
  names.ep = megatron_args_moe(j) ? args_ep(j) : 1;
  if (megatron_rank_dir(names, 0, 0, 0) != first_dir)
    return bad_args(first, "pipeline_model_parallel_size = " + std::to_string(pp) + " and expert_model_parallel_size = " +
                               std::to_string(names.ep) + " name the first rank directory " +
                               megatron_rank_dir(names, 0, 0, 0) + ", the checkpoint's is " + first_dir);
  nlohmann::json meta = {{"megatron", megatron_meta(f0->root(), f0->optimizer(), dir)}};
  if (!j.contains("vocab_size") || !j["vocab_size"].is_number_integer()) {
    j["vocab_size"] = j.contains("padded_vocab_size") ? j["padded_vocab_size"] : nlohmann::json();
    meta["megatron"]["vocab_size_from"] = "padded_vocab_size";
  }
  if (names.ep > 1 || megatron_args_moe(j)) return open_moe(path, std::move(j), std::move(f0), names, std::move(meta), dir);
  const int vpp = f0->chunks();
  std::vector<std::unique_ptr<TorchRankFile>> files;  // index pp_rank * tp + tp_rank
  std::vector<std::string> paths;
  for (int p = 0; p < pp; ++p)
    for (int r = 0; r < tp; ++r) {
      const std::string f = dir + "/" + megatron_rank_dir(names, r, p) + "/model_optim_rng.pt";
      std::unique_ptr<TorchRankFile> rf;
      if (p == 0 && r == 0) {
        rf = std::move(f0);
      } else {
        CKPT_ASSIGN_OR_RETURN(rf, TorchRankFile::open(f));
      }
      if (rf->chunks() != vpp)
        return Status::Error("MegatronVppChunkCountMismatch",
                             "'" + f + "' holds " + std::to_string(rf->chunks()) + " model chunk(s), '" + first +
                                 "' holds " + std::to_string(vpp) + " (model0 .. model" + std::to_string(vpp - 1) + ")")
            .with_file(f);
      files.push_back(std::move(rf));
      paths.push_back(f);
    }
  if (vpp > 1) return open_vpp(path, std::move(j), std::move(files), std::move(paths), std::move(meta));
  MegatronRankFiles ranks;
  std::vector<int> per_stage;
  for (size_t i = 0; i < files.size(); ++i) {
    if (i % static_cast<size_t>(tp) == 0) per_stage.push_back(static_cast<int>(local_layers(*files[i])));
    ranks.files.push_back(std::move(files[i]));
  }
  ranks.paths = std::move(paths);
  if (pp > 1) j["layers_per_stage"] = per_stage;
  ranks.integrity = ranks.files.front()->integrity();
  CKPT_ASSIGN_OR_RETURN(MegatronArgs a, megatron_args_from_json(std::move(j), first));
  return open_megatron_ranks(path, std::move(a), std::move(ranks), std::move(meta));
}

}  // namespace megatron_torch_detail

std::string megatron_mcore_name(const std::string& name_in) {
  std::string name = name_in;
  for (const auto& [from, to] : megatron_torch_detail::kLegacyRenames)
    if (size_t at = name.find(from); at != std::string::npos) name.replace(at, std::string(from).size(), to);
  return name;
}

bool is_megatron_torch_dir(const std::string& path) {
  std::error_code ec;
  namespace fs = std::filesystem;
  if (!fs::is_directory(path, ec)) return false;
  if (fs::is_regular_file(path + "/latest_checkpointed_iteration.txt", ec)) return true;
  return fs::is_regular_file(path + "/mp_rank_00/model_optim_rng.pt", ec) ||
         fs::is_regular_file(path + "/mp_rank_00_000/model_optim_rng.pt", ec) ||
         fs::is_regular_file(path + "/mp_rank_00_000_000/model_optim_rng.pt", ec);
}

Result<std::unique_ptr<TensorSource>> open_megatron_torch_dir(const std::string& path) {
  return megatron_torch_detail::open_dir(path);
}

}  // namespace ckpt
