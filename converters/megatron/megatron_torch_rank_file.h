// The views of one Megatron-LM legacy rank file (iter_N/mp_rank_*/model_optim_rng.pt) that
// megatron_torch_source.cc opens: TorchRankFile (its 'model' tensors in mcore naming, or a virtual
// pipeline's 'model0' .. 'model{v-1}', and the optimizer's pieces beside them) and TorchChunkView
// (one chunk of a virtual-pipeline file, converters/megatron/megatron_vpp.h). Internal to
// converters/megatron (namespace megatron_torch_detail).
// Thread safety: as TensorSource (reads from any thread, the rest one thread at a time).
#pragma once

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

#include <nlohmann/json.hpp>

namespace ckpt {
namespace megatron_torch_detail {

namespace fs = std::filesystem;
using torch::PyObj;
using torch::PyType;

// The args Namespace of a rank file as a JSON object (the scalar fields); megatron_torch_source.cc.
Result<nlohmann::json> args_json(const PyObj* root, const std::string& file);

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
    CKPT_RETURN_IF_ERROR(f->add_optimizer());
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
  // model parameters are the 'model' tensors in order (TransformerEngine _extra_state excluded). A
  // virtual pipeline's: distrib_optim.pt only (one grad buffer per chunk, each over its chunk's
  // parameters); its non-distributed 'optimizer' state is named not imported.
  Status add_optimizer() {
    std::vector<MegatronModelParam> params;
    std::vector<std::vector<MegatronModelParam>> per_chunk(static_cast<size_t>(chunks_));
    const std::string extra = "._extra_state";
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const TensorMeta& t = tensors_[i];
      if (t.name.size() < extra.size() || t.name.compare(t.name.size() - extra.size(), extra.size(), extra) != 0) {
        params.push_back({t.name, t.shape, t.dtype, refs_[i]});
        per_chunk[static_cast<size_t>(chunk_of_[i])].push_back(params.back());
      }
    }
    const std::string beside = (fs::path(file_->path()).parent_path() / "distrib_optim.pt").string();
    std::error_code ec;
    const bool distrib = fs::is_regular_file(beside, ec);
    const std::string vpp_note = "a virtual pipeline's optimizer state over model0..model" + std::to_string(chunks_ - 1) +
                                 " is read from distrib_optim.pt only (the distributed optimizer)";
    if (chunks_ > 1 && !distrib) {
      if (file_->root()->get("optimizer") != nullptr) optim_.not_imported = vpp_note;
      return Status::Ok();
    }
    // A mixture-of-experts model (its experts' parameters in groups of their own, or expert buffers
    // in distrib_optim.pt): weights only (docs/MOE.md step 3).
    for (const MegatronModelParam& p : params)
      if (p.name.find(".mlp.router.") != std::string::npos) {
        if (file_->root()->get("optimizer") != nullptr || distrib)
          optim_.not_imported = "the optimizer state of a mixture-of-experts model is not imported yet (weights only; docs/MOE.md)";
        return Status::Ok();
      }
    CKPT_ASSIGN_OR_RETURN(optim_, megatron_legacy_optimizer(*file_, params));
    const std::vector<MegatronOptimTensor>* ts = &optim_.tensors;
    if (optim_.tensors.empty() && optim_.not_imported.find("distrib_optim.pt") != std::string::npos && distrib) {
      CKPT_ASSIGN_OR_RETURN(nlohmann::json args, args_json(file_->root(), file_->path()));
      const std::string dir = fs::path(file_->path()).parent_path().filename().string();  // mp_rank_TT[_PPP]
      const int pp_rank = dir.size() == 14 ? std::atoi(dir.c_str() + 11) : 0;
      CKPT_ASSIGN_OR_RETURN(distrib_, megatron_distrib_optim(beside, per_chunk, args, pp_rank));
      optim_.not_imported.clear();
      distrib_first_ = pieces_.size();
      ts = &distrib_.tensors;
    } else if (chunks_ > 1) {  // distrib_optim.pt beside an 'optimizer' that is not DistributedOptimizer's
      optim_.tensors.clear();
      optim_.not_imported = vpp_note;
      return Status::Ok();
    }
    for (size_t k = 0; k < ts->size(); ++k) {
      const MegatronOptimTensor& o = (*ts)[k];
      const Shape shape(o.ref->size.begin(), o.ref->size.end());
      tensors_.push_back({o.name, o.ref->storage.dtype, shape});
      pieces_.push_back({o.name, Region{Box::whole(shape)}, o.ref->storage.dtype});
      refs_.push_back(o.ref);
      chunk_of_.push_back(ts == &distrib_.tensors ? distrib_.chunk_of[k] : 0);
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
  std::vector<int> chunk_of_;  // per piece: the model chunk (model and optimizer pieces)
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

}  // namespace megatron_torch_detail
}  // namespace ckpt
