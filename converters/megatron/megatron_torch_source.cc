#include "converters/megatron/megatron_torch_source.h"

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

// One rank file: its 'model' tensors in mcore naming, one whole piece each.
class TorchRankFile final : public TensorSource {
 public:
  const std::vector<TensorMeta>& tensors() const override { return tensors_; }
  const std::vector<Piece>& pieces() const override { return pieces_; }
  const nlohmann::json& metadata() const override { return meta_; }
  std::string describe() const override { return file_->path(); }
  Status read(size_t piece, const Box& sub, void* dst) override {
    if (piece >= refs_.size()) return Status::Internal("torch rank piece out of range");
    return file_of(piece).read_tensor(*refs_[piece], sub, dst);
  }
  std::optional<FileExtent> file_extent(size_t piece, const Box& sub) override {
    return piece < refs_.size() ? file_of(piece).tensor_extent(*refs_[piece], sub) : std::nullopt;
  }

  // Integrity: every zip entry's CRC-32 (storages, data.pkl, version, ...).
  IntegrityInfo integrity() const override {
    return {"Megatron-LM torch files", "zip CRC-32",
            "Megatron-LM torch files: latest_checkpointed_iteration.txt has no checksum; CRC-32 finds damaged bytes, not deliberate edits"};
  }
  CheckReport check(const CheckOptions& o) override {
    CheckReport rep;
    uint64_t total = 0, done = 0, unit = 0;
    if (auto es = file_->zip_entries(); es.ok()) {
      const uint64_t shares = static_cast<uint64_t>(std::max(1, o.shares));
      for (size_t i = 0; i < es->size(); ++i)
        if (i % shares == static_cast<uint64_t>(o.share)) total += (*es)[i].size;
    }
    auto on_bytes = [&](uint64_t n) {
      done += n;
      if (o.progress) o.progress(done, total);
    };
    torch::check_zip_entries(*file_, o, &unit, file_->path(), "", [&](const std::string& key) { return owner(key); }, on_bytes, rep);
    if (distrib_.file)  // distrib_optim.pt
      torch::check_zip_entries(*distrib_.file, o, &unit, distrib_.file->path(), "",
                               [](const std::string&) { return torch::ZipEntryOwner{}; }, on_bytes, rep);
    return rep;
  }
  // The entry holding piece `piece`'s storage, CRC-checked once (the outcome is kept).
  Status check_piece(size_t piece) override {
    if (piece >= refs_.size()) return Status::InvalidArgument("piece index " + std::to_string(piece) + " out of range");
    torch::TorchFile& tf = file_of(piece);
    std::optional<size_t> entry = tf.storage_entry(refs_[piece]->storage.key);
    if (!entry) return Status::Internal("no zip entry for storage '" + refs_[piece]->storage.key + "'");
    std::lock_guard<std::mutex> g(checked_mu_);
    const std::pair<const void*, size_t> key{&tf, *entry};
    auto it = checked_.find(key);
    if (it != checked_.end()) return it->second;
    Status st = tf.check_entry(*entry);
    if (!st.ok()) (void)std::move(st).with_tensor(pieces_[piece].tensor);
    return checked_[key] = st;
  }

  static Result<std::unique_ptr<TorchRankFile>> open(const std::string& path) {
    std::error_code ec;
    if (!fs::is_regular_file(path, ec))
      return Status::NotFound("Megatron rank file '" + path + "' is missing").with_file(path);
    CKPT_ASSIGN_OR_RETURN(auto tf, torch::TorchFile::open(path));
    auto f = std::unique_ptr<TorchRankFile>(new TorchRankFile());
    f->file_ = std::move(tf);
    const PyObj* root = f->file_->root();
    if (!root->is(PyType::kDict))
      return Status::Error("MegatronNotStateDict", "'" + path + "' holds a " + py_type_name(root->type) +
                                                       ", not Megatron's checkpoint dict").with_file(path);
    CKPT_ASSIGN_OR_RETURN(std::vector<const PyObj*> models, model_chunks(root, path));
    for (size_t c = 0; c < models.size(); ++c) {
      std::set<std::string> seen;  // names restart in each chunk
      CKPT_RETURN_IF_ERROR(f->add_tensors(models[c], "", 0, seen));
      f->chunk_of_.resize(f->pieces_.size(), static_cast<int>(c));
    }
    f->chunks_ = static_cast<int>(models.size());
    if (f->chunks_ == 1) {
      CKPT_RETURN_IF_ERROR(f->add_optimizer());
    } else {
      std::error_code ec;
      const bool distrib = fs::is_regular_file(fs::path(path).parent_path() / "distrib_optim.pt", ec);
      if (root->get("optimizer") != nullptr || distrib)
        f->optim_.not_imported = std::string("a virtual pipeline's optimizer state (") +
                                 (distrib ? "distrib_optim.pt" : "'optimizer'") +
                                 " over model0..model" + std::to_string(f->chunks_ - 1) + ") is not read yet";
    }
    return f;
  }

  // The model state dicts of a rank file: 'model', or with a virtual pipeline 'model0' ..
  // 'model{v-1}' (megatron/training/checkpointing.py generate_state_dict), each a dict, none missing.
  static Result<std::vector<const PyObj*>> model_chunks(const PyObj* root, const std::string& path) {
    if (const PyObj* model = root->get("model"); model != nullptr) {
      if (!model->is(PyType::kDict))
        return Status::Error("MegatronNotStateDict", "'" + path + "': 'model' is a " + py_type_name(model->type) +
                                                         ", not a state dict").with_file(path);
      return std::vector<const PyObj*>{model};
    }
    // Every 'model<N>' key: N must run 0 .. v-1 without a gap.
    std::set<int64_t> present;
    for (const auto& [k, v] : root->entries) {
      if (!k->is(PyType::kStr) || k->s.size() < 6 || k->s.size() > 11 || k->s.rfind("model", 0) != 0) continue;
      const std::string num = k->s.substr(5);
      if (!std::all_of(num.begin(), num.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) continue;
      present.insert(std::stoll(num));
    }
    if (present.empty())
      return Status::Error("MegatronNotStateDict", "'" + path + "' has no 'model' state dict (nor model0, model1, ... of "
                                                     "a virtual pipeline)").with_file(path);
    std::vector<const PyObj*> out;
    for (int64_t c = 0; c <= *present.rbegin(); ++c) {
      const std::string key = "model" + std::to_string(c);
      const PyObj* m = root->get(key);
      if (m == nullptr)
        return Status::Error("MegatronVppChunkMissing", "'" + path + "' holds model0 .. model" +
                                                            std::to_string(*present.rbegin()) + " of a virtual pipeline "
                                                            "but no '" + key + "'").with_file(path).with_tensor(key);
      if (!m->is(PyType::kDict))
        return Status::Error("MegatronNotStateDict", "'" + path + "': '" + key + "' is a " + py_type_name(m->type) +
                                                         ", not a state dict").with_file(path).with_tensor(key);
      out.push_back(m);
    }
    return out;
  }

  const PyObj* root() const { return file_->root(); }
  const MegatronLegacyOptim& optimizer() const { return optim_; }
  // 1, or v with a virtual pipeline (model0 .. model{v-1}); the chunk of each model piece.
  int chunks() const { return chunks_; }
  const std::vector<int>& chunk_of() const { return chunk_of_; }

 private:
  TorchRankFile() = default;

  // The tensors of a (possibly nested: older Megatron-LM saves {'language_model': {'embedding':
  // {'word_embeddings': {'weight': T}}, 'encoder': {'layers.0...': T}}}) state dict, keys joined by
  // '.'; non-tensor values (_extra_state) skipped.
  Status add_tensors(const PyObj* dict, const std::string& prefix, int depth, std::set<std::string>& seen) {
    const std::string& path = file_->path();
    if (depth > 8) return Status::Error("MegatronNotStateDict", "'" + path + "': 'model' nests deeper than 8 dicts").with_file(path);
    for (const auto& [k, v] : dict->entries) {
      if (!k->is(PyType::kStr)) continue;
      if (v->is(PyType::kDict)) {
        CKPT_RETURN_IF_ERROR(add_tensors(v, prefix + k->s + ".", depth + 1, seen));
        continue;
      }
      if (!v->is(PyType::kTensor)) continue;  // _extra_state and the like
      const std::string name = megatron_mcore_name(prefix + k->s);
      if (!seen.insert(name).second)
        return Status::Error("MegatronNotStateDict", "'" + path + "': tensor '" + prefix + k->s + "' names '" + name +
                                                         "' a second time (both naming generations?)")
            .with_file(path).with_tensor(prefix + k->s);
      const Shape shape(v->tensor.size.begin(), v->tensor.size.end());
      tensors_.push_back({name, v->tensor.storage.dtype, shape});
      pieces_.push_back({name, Region{Box::whole(shape)}, v->tensor.storage.dtype});
      refs_.push_back(&v->tensor);
    }
    return Status::Ok();
  }

  // The optimizer tensors (converters/megatron/megatron_torch_optim.h), named <prefix><mcore name>: the
  // model parameters are the 'model' tensors in order (TransformerEngine _extra_state excluded).
  Status add_optimizer() {
    std::vector<MegatronModelParam> params;
    const std::string extra = "._extra_state";
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const TensorMeta& t = tensors_[i];
      if (t.name.size() < extra.size() || t.name.compare(t.name.size() - extra.size(), extra.size(), extra) != 0)
        params.push_back({t.name, t.shape, t.dtype, refs_[i]});
    }
    CKPT_ASSIGN_OR_RETURN(optim_, megatron_legacy_optimizer(*file_, params));
    const std::string beside = (fs::path(file_->path()).parent_path() / "distrib_optim.pt").string();
    std::error_code ec;
    const std::vector<MegatronOptimTensor>* ts = &optim_.tensors;
    if (optim_.tensors.empty() && optim_.not_imported.find("distrib_optim.pt") != std::string::npos &&
        fs::is_regular_file(beside, ec)) {  // the distributed optimizer's state
      CKPT_ASSIGN_OR_RETURN(nlohmann::json args, args_json(file_->root(), file_->path()));
      const std::string dir = fs::path(file_->path()).parent_path().filename().string();  // mp_rank_TT[_PPP]
      const int pp_rank = dir.size() == 14 ? std::atoi(dir.c_str() + 11) : 0;
      CKPT_ASSIGN_OR_RETURN(distrib_, megatron_distrib_optim(beside, params, args, pp_rank));
      optim_.not_imported.clear();
      distrib_first_ = pieces_.size();
      ts = &distrib_.tensors;
    }
    for (const MegatronOptimTensor& o : *ts) {
      const Shape shape(o.ref->size.begin(), o.ref->size.end());
      tensors_.push_back({o.name, o.ref->storage.dtype, shape});
      pieces_.push_back({o.name, Region{Box::whole(shape)}, o.ref->storage.dtype});
      refs_.push_back(o.ref);
    }
    return Status::Ok();
  }

  // The first piece over storage `key`, and its tensor (check failures name them).
  torch::ZipEntryOwner owner(const std::string& key) const {
    for (size_t i = 0; i < refs_.size(); ++i)
      if (refs_[i]->storage.key == key) return {i, pieces_[i].tensor};
    return {};
  }

  std::unique_ptr<torch::TorchFile> file_;
  std::mutex checked_mu_;
  std::map<std::pair<const void*, size_t>, Status> checked_;  // (file, zip entry) -> outcome of its CRC check
  MegatronLegacyOptim optim_;
  MegatronDistribOptim distrib_;  // distrib_optim.pt beside the file, when the optimizer is distributed
  size_t distrib_first_ = SIZE_MAX;  // pieces from here on read distrib_.file
  torch::TorchFile& file_of(size_t piece) { return piece >= distrib_first_ ? *distrib_.file : *file_; }
  std::vector<TensorMeta> tensors_;
  std::vector<Piece> pieces_;
  std::vector<const torch::TensorRef*> refs_;
  int chunks_ = 1;
  std::vector<int> chunk_of_;  // per model piece (the optimizer's pieces follow, chunks_ == 1 only)
  nlohmann::json meta_ = nlohmann::json::object();
};

// Chunk `chunk` of a virtual-pipeline rank file: its 'model<chunk>' tensors (names as the chunk
// numbers them, layers from 0), pieces forwarded to the file. The file's own check (every zip
// entry once) runs in chunk 0's view; the other chunks' check() is empty.
class TorchChunkView final : public TensorSource {
 public:
  TorchChunkView(std::shared_ptr<TorchRankFile> file, int chunk) : file_(std::move(file)), chunk_(chunk) {
    for (size_t i = 0; i < file_->chunk_of().size(); ++i)
      if (file_->chunk_of()[i] == chunk) {
        inner_.push_back(i);
        pieces_.push_back(file_->pieces()[i]);
        tensors_.push_back(file_->tensors()[i]);
      }
  }
  const std::vector<TensorMeta>& tensors() const override { return tensors_; }
  const std::vector<Piece>& pieces() const override { return pieces_; }
  const nlohmann::json& metadata() const override { return file_->metadata(); }
  std::string describe() const override { return file_->describe() + " (model" + std::to_string(chunk_) + ")"; }
  Status read(size_t piece, const Box& sub, void* dst) override {
    if (piece >= inner_.size()) return Status::Internal("torch chunk piece out of range");
    return file_->read(inner_[piece], sub, dst);
  }
  std::optional<FileExtent> file_extent(size_t piece, const Box& sub) override {
    return piece < inner_.size() ? file_->file_extent(inner_[piece], sub) : std::nullopt;
  }
  IntegrityInfo integrity() const override { return file_->integrity(); }
  CheckReport check(const CheckOptions& o) override {
    if (chunk_ != 0) return CheckReport{};
    return check_of_inner(*file_, o, /*same_pieces=*/false);
  }
  Status check_piece(size_t piece) override {
    if (piece >= inner_.size()) return Status::InvalidArgument("piece index " + std::to_string(piece) + " out of range");
    return file_->check_piece(inner_[piece]);
  }

 private:
  std::shared_ptr<TorchRankFile> file_;
  int chunk_;
  std::vector<size_t> inner_;  // piece index in the file, per piece of this view
  std::vector<TensorMeta> tensors_;
  std::vector<Piece> pieces_;
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
  if (!optim.tensors.empty() && !optim.adam.empty()) m["adam"] = optim.adam;
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

Result<std::unique_ptr<TensorSource>> open_dir(const std::string& path_in) {
  std::string path = path_in;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  CKPT_ASSIGN_OR_RETURN(const std::string dir, iteration_dir(path));
  std::error_code ec;
  const bool pp1 = fs::is_directory(dir + "/mp_rank_00", ec);
  // A run dir whose iteration holds DCP data (torch_dist) but no metadata.json: the torch_dist
  // detection passed it by (metadata.json is what marks a complete torch_dist save).
  if (!pp1 && !fs::is_directory(dir + "/mp_rank_00_000", ec)) {
    bool dcp = fs::is_regular_file(dir + "/.metadata", ec) || fs::is_regular_file(dir + "/common.pt", ec);
    for (fs::directory_iterator it(dir, ec), end; !dcp && !ec && it != end; it.increment(ec)) dcp = it->path().extension() == ".distcp";
    if (dcp)
      return Status::Error("IncompleteCheckpoint", "'" + dir + "' holds Megatron-Core torch_dist data (.metadata / .distcp / common.pt) but " +
                                                       (fs::is_regular_file(dir + "/.metadata", ec)
                                                            ? "no metadata.json, which Megatron-Core writes last"
                                                            : "neither .metadata nor metadata.json") +
                                                       ": the save did not complete")
          .with_file(dir + "/metadata.json");
  }
  const std::string first = dir + (pp1 ? "/mp_rank_00" : "/mp_rank_00_000") + "/model_optim_rng.pt";
  CKPT_ASSIGN_OR_RETURN(auto f0, TorchRankFile::open(first));
  CKPT_ASSIGN_OR_RETURN(nlohmann::json j, args_json(f0->root(), first));
  const auto [tp, pp] = args_tp_pp(j);
  if (pp1 != (pp == 1))
    return bad_args(first, "pipeline_model_parallel_size = " + std::to_string(pp) + " but the rank directories are named " +
                               (pp1 ? "mp_rank_TT" : "mp_rank_TT_PPP"));
  nlohmann::json meta = {{"megatron", megatron_meta(f0->root(), f0->optimizer(), dir)}};
  if (!j.contains("vocab_size") || !j["vocab_size"].is_number_integer()) {
    j["vocab_size"] = j.contains("padded_vocab_size") ? j["padded_vocab_size"] : nlohmann::json();
    meta["megatron"]["vocab_size_from"] = "padded_vocab_size";
  }
  Layout names;
  names.tp = tp;
  names.pp = pp;
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
         fs::is_regular_file(path + "/mp_rank_00_000/model_optim_rng.pt", ec);
}

Result<std::unique_ptr<TensorSource>> open_megatron_torch_dir(const std::string& path) {
  return megatron_torch_detail::open_dir(path);
}

}  // namespace ckpt
