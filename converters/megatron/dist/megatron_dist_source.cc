#include "converters/megatron/dist/megatron_dist_source.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <unordered_map>

#include "converters/megatron/dist/megatron_dist_common.h"
#include "converters/megatron/dist/megatron_dist_map.h"
#include "converters/megatron/dist/megatron_dist_optim.h"
#include "converters/megatron/dist/megatron_integrity.h"
#include "formats/torch/dcp/dcp.h"
#include "formats/torch/torch_file.h"

namespace ckpt {

namespace dist_source_detail {

class MegatronDistSource final : public TensorSource {
 public:
  static Result<std::unique_ptr<TensorSource>> open(const std::string& path);

  const std::vector<TensorMeta>& tensors() const override { return tensors_; }
  const std::vector<Piece>& pieces() const override { return pieces_; }
  const nlohmann::json& metadata() const override { return meta_; }
  std::string describe() const override { return dir_; }

  Status read(size_t piece, const Box& sub, void* dst) override {
    if (piece >= map_.size()) return Status::Internal("MegatronDistSource::read: bad piece");
    if (const Map& m = map_[piece]; m.flat != kNoFlat) {
      const DistOptimPiece& f = flat_[m.flat];
      return read_dist_optim(*dcp_, f.world >= 0 ? no_chunks_ : dcp_pieces_[dcp_->tensors()[f.dcp_tensor].name], worlds_,
                             f, sub, dst);
    }
    return dcp_->read(map_[piece].inner, dcp_box(piece, sub), dst);
  }
  std::optional<FileExtent> file_extent(size_t piece, const Box& sub) override {
    if (piece >= map_.size() || map_[piece].flat != kNoFlat) return std::nullopt;
    return dcp_->file_extent(map_[piece].inner, dcp_box(piece, sub));
  }

  // Integrity: the DCP's (zip CRC-32 of every torch.save item's entries), the common state's zip
  // entries (common.pt, or the common_state item), and Megatron's integrity.json (SHA-256 per file).
  IntegrityInfo integrity() const override {
    IntegrityInfo d = dcp_->integrity();
    if (has_megatron_integrity(dir_))
      return {"Megatron-Core torch_dist", d.scheme + " + integrity.json SHA-256 per file", "", {"sha256"}};
    return {"Megatron-Core torch_dist", d.scheme,
            "Megatron-Core torch_dist: .metadata (a pickle), metadata.json and the bytes items (_extra_state, rng state) have "
            "no checksums: read, not checkable; this checkpoint has no integrity.json (megatron-core 0.18+ --verify-integrity)"};
  }
  CheckReport check(const CheckOptions& o) override;
  Status check_piece(size_t piece) override {
    if (piece >= map_.size()) return Status::InvalidArgument("piece index " + std::to_string(piece) + " out of range");
    if (map_[piece].flat != kNoFlat) {  // a distributed optimizer bucket: its chunks
      if (flat_[map_[piece].flat].world >= 0) return Status::Ok();  // a param_state item: check() covers its zip
      for (size_t ip : dcp_pieces_[dcp_->tensors()[flat_[map_[piece].flat].dcp_tensor].name])
        CKPT_RETURN_IF_ERROR(dcp_->check_piece(ip));
      return Status::Ok();
    }
    return dcp_->check_piece(map_[piece].inner);
  }

 private:
  // Piece -> DCP piece `inner`; mcore coords = [lead_offset..., canonical + delta]. Or, with
  // `flat` set, flat_[flat]: a distributed optimizer bucket's slice (dp_reshardable).
  static constexpr size_t kNoFlat = SIZE_MAX;
  struct Map {
    size_t inner;
    size_t lead;
    Shape lead_offset;
    Shape delta;
    size_t flat = kNoFlat;
  };

  Status add_tensor(const DistTensor& t, const std::string& dcp_name, const std::string& prefix);
  Status add_dist_optim(DistOptimPlan plan);

  // The first piece of this view read from DCP piece `inner`; kNoPiece when none (padding rows,
  // tensors the view does not map).
  size_t outer_piece(size_t inner) const {
    for (size_t i = 0; i < map_.size(); ++i)
      if (map_[i].inner == inner) return i;
    return CheckFailure::kNoPiece;
  }

  // `sub` (canonical coordinates) as a box of the mcore tensor: [lead_offset..., sub + delta].
  Box dcp_box(size_t piece, const Box& sub) const {
    const Map& m = map_[piece];
    Box mb;
    mb.offset = m.lead_offset;
    mb.extent = Shape(m.lead, 1);
    for (size_t d = 0; d < sub.ndim(); ++d) {
      mb.offset.push_back(sub.offset[d] + m.delta[d]);
      mb.extent.push_back(sub.extent[d]);
    }
    return mb;
  }

  // The common state's torch.save zip: common.pt whole, or the common_state item's range.
  struct CommonZip {
    std::string path;
    uint64_t offset = 0, length = UINT64_MAX;
  };
  std::optional<CommonZip> common_zip() const;
  void note_not_imported(const std::vector<std::string>& keys, const std::string& sharding, const std::string& reason);

  std::string dir_;
  std::string common_source_;
  std::unique_ptr<TensorSource> dcp_;
  std::unordered_map<std::string, size_t> dcp_tensor_;
  std::set<std::string> read_;  // DCP tensors this view reads, or supersedes (weights under fp32 masters)
  std::unordered_map<std::string, std::vector<size_t>> dcp_pieces_;
  std::map<std::string, Shape> canonical_shape_;
  std::vector<TensorMeta> tensors_;
  std::vector<Piece> pieces_;
  std::vector<Map> map_;
  std::vector<DistOptimPiece> flat_;
  std::vector<DistOptimWorld> worlds_;
  std::vector<size_t> no_chunks_;
  nlohmann::json meta_;
};

std::optional<MegatronDistSource::CommonZip> MegatronDistSource::common_zip() const {
  if (common_source_ == "common.pt") return CommonZip{dir_ + "/common.pt"};
  if (const torch::DcpMetadata* md = torch::dcp_metadata_of(*dcp_))
    for (const auto& b : md->bytes)
      if (b.fqn == common_source_) return CommonZip{(std::filesystem::path(dir_) / b.file).string(), b.offset, b.length};
  return std::nullopt;
}

// The DCP's units, then the common state's zip entries, then integrity.json's files (unit numbers
// continue in that order).
CheckReport MegatronDistSource::check(const CheckOptions& o) {
  const std::optional<CommonZip> cz = common_zip();
  uint64_t common_total = 0, done = 0, dcp_total = 0;
  std::error_code ec;
  if (cz) common_total = cz->length != UINT64_MAX ? cz->length : std::filesystem::file_size(cz->path, ec) * !ec;
  const uint64_t integrity_total = has_megatron_integrity(dir_) ? megatron_integrity_bytes(dir_) : 0;
  auto report = [&](uint64_t d) {
    if (o.progress) o.progress(d, std::max(dcp_total + common_total + integrity_total, d));
  };
  CheckOptions dco = o;
  if (o.progress)
    dco.progress = [&](uint64_t d, uint64_t t) {
      dcp_total = t;
      done = d;
      report(d);
    };
  CheckReport rep = dcp_->check(dco);
  for (CheckFailure& f : rep.failures)
    if (f.piece != CheckFailure::kNoPiece) f.piece = outer_piece(f.piece);
  const uint64_t dcp_done = std::max(done, dcp_total);
  uint64_t extra = 0;
  auto on_bytes = [&](uint64_t n) { report(dcp_done + (extra += n)); };
  const nlohmann::json& dm = dcp_->metadata();
  uint64_t unit = dcp_->pieces().size() + (dm.contains("dcp") && dm["dcp"].contains("bytes") ? dm["dcp"]["bytes"].size() : 0);
  CheckReport c;
  if (cz) {
    auto tf = torch::TorchFile::open(cz->path, cz->offset, cz->length, torch::TorchFileLimits{uint64_t{64} << 20, {}});
    if (!tf.ok())
      c.failures.push_back({CheckFailure::kNoPiece, tf.take_status().with_file(cz->path), "", cz->path, common_source_});
    else
      torch::check_zip_entries(**tf, o, &unit, cz->path, common_source_, [](const std::string&) { return torch::ZipEntryOwner{}; },
                               on_bytes, c);
  }
  if (has_megatron_integrity(dir_)) check_megatron_integrity(dir_, o, &unit, on_bytes, c);
  rep.pieces += c.pieces;
  rep.bytes += c.bytes;
  for (CheckFailure& f : c.failures) rep.failures.push_back(std::move(f));
  return rep;
}

// Every DCP tensor and bytes item named optimizer.* that this view does not read is listed (by
// key) in metadata megatron.optimizer_not_imported (inspect shows it): never dropped silently.
void MegatronDistSource::note_not_imported(const std::vector<std::string>& keys, const std::string& sharding,
                                           const std::string& reason) {
  if (keys.empty()) return;
  std::string list;
  for (size_t i = 0; i < keys.size() && i < 8; ++i) list += (i ? ", " : "") + keys[i];
  if (keys.size() > 8) list += ", ... (" + std::to_string(keys.size()) + " entries)";
  nlohmann::json& mg = meta_["megatron"];
  const std::string why =
      reason.empty() ? "ckpt reads optimizer.state.{fp32_param,param,exp_avg,exp_avg_sq}.<key> and dp_reshardable buckets" : reason;
  mg["optimizer_not_imported"] = "optimizer state " + (sharding.empty() ? std::string() : "of sharding type '" + sharding + "' ") +
                                 "not imported (" + why + "): " + list;
  mg["optimizer_not_imported_keys"] = keys;
  if (!sharding.empty()) mg["optimizer_sharding_type"] = sharding;
}

Status MegatronDistSource::add_tensor(const DistTensor& t, const std::string& dcp_name, const std::string& prefix) {
  read_.insert(dcp_name);
  const TensorMeta& dm = dcp_->tensors()[dcp_tensor_.at(dcp_name)];
  if (dm.shape != t.shape)
    return Status::Error("ShapeMismatch", "'" + dir_ + "': tensor '" + dcp_name + "' has shape " +
                                              shape_to_string(dm.shape) + ", the args imply " + shape_to_string(t.shape))
        .with_tensor(dcp_name);
  for (const DistChunk& c : t.chunks)
    for (size_t s = 0; s < c.segments.size(); ++s) {
      const MegatronSegment& sg = c.segments[s];
      if (sg.tensor.empty()) continue;
      const std::string name = prefix + sg.tensor;
      if (!canonical_shape_.count(name)) return Status::Internal("no canonical shape for '" + name + "'");
      const Box mb = dist_segment_box(c, s);
      const size_t lead = mb.ndim() - sg.box.ndim();
      for (size_t ip : dcp_pieces_[dcp_name]) {
        auto x = intersect(mb, dcp_->pieces()[ip].region.box);
        if (!x || x->empty()) continue;
        Map m{ip, lead, Shape(x->offset.begin(), x->offset.begin() + lead), {}};
        Box cb;
        for (size_t d = 0; d < sg.box.ndim(); ++d) {
          m.delta.push_back(mb.offset[d + lead] - sg.box.offset[d]);
          cb.offset.push_back(x->offset[d + lead] - m.delta[d]);
          cb.extent.push_back(x->extent[d + lead]);
        }
        pieces_.push_back(Piece{name, Region{cb}, dcp_->pieces()[ip].dtype});
        map_.push_back(std::move(m));
      }
    }
  return Status::Ok();
}

// An MoE layer's norm: the local spec's key mlp.linear_fc1.layer_norm_weight (the map's), or with
// Transformer Engine's spec, which keeps the MoE layer's norm apart, pre_mlp_layernorm.weight.
template <class Index>
std::string moe_norm_key(const std::string& key, const LlamaConfig& cfg, const Index& dcp_tensor) {
  const std::string local = ".mlp.linear_fc1.layer_norm_weight";
  if (!cfg.moe || dcp_tensor.count(key) || key.size() < local.size() ||
      key.compare(key.size() - local.size(), local.size(), local) != 0)
    return key;
  return key.substr(0, key.size() - local.size()) + ".pre_mlp_layernorm.weight";
}

// Layer count and padded vocabulary from the stacked shapes (embedding rows, qkv layers).
Result<std::pair<int64_t, int64_t>> dist_shapes(const TensorSource& dcp, const std::string& dir) {
  int64_t layers = -1, padded = -1;
  for (const auto& t : dcp.tensors()) {
    if (t.name == "embedding.word_embeddings.weight" && t.shape.size() == 2) padded = t.shape[0];
    if (t.name == "decoder.layers.self_attention.linear_qkv.weight" && t.shape.size() == 3) layers = t.shape[0];
  }
  // An MoE model: one key per layer, decoder.layers.<l>.self_attention.linear_qkv.weight.
  const std::string pre = "decoder.layers.", post = ".self_attention.linear_qkv.weight";
  for (const auto& t : dcp.tensors())
    if (layers < 0 && t.shape.size() == 2 && t.name.size() > pre.size() + post.size() && t.name.rfind(pre, 0) == 0 &&
        t.name.compare(t.name.size() - post.size(), post.size(), post) == 0) {
      const std::string num = t.name.substr(pre.size(), t.name.size() - pre.size() - post.size());
      if (num.empty() || num.size() > 7 || num.find_first_not_of("0123456789") != std::string::npos) continue;
      int64_t n = 0;
      for (const auto& u : dcp.tensors())
        if (u.name.rfind(pre, 0) == 0 && u.name.size() > pre.size() + post.size() &&
            u.name.compare(u.name.size() - post.size(), post.size(), post) == 0)
          ++n;
      layers = n;
      break;
    }
  if (layers < 1 || padded < 1)
    return Status::Error("NotMegatronDist", "'" + dir +
                                                "' has no stacked decoder.layers.self_attention.linear_qkv.weight "
                                                "[layers, rows, hidden] and embedding.word_embeddings.weight [vocab, "
                                                "hidden]: not a megatron-core GPT torch_dist checkpoint")
        .with_file(dir);
  return std::make_pair(layers, padded);
}

// The saved layout (for inspect and reshard's settings): tp, pp from the args, the stage split
// from Megatron-LM's decoder_first/last_pipeline_num_layers (else even, earlier stages taking the
// remainder), the vocab divisor from make_vocab_size_divisible_by. Null when the args do not fit.
nlohmann::json saved_layout(const nlohmann::json& args, int64_t layers) {
  auto num = [&](const char* k, int64_t dflt) {
    return args.contains(k) && args[k].is_number_integer() ? args[k].get<int64_t>() : dflt;
  };
  const int64_t tp = num("tensor_model_parallel_size", 1), pp = num("pipeline_model_parallel_size", 1);
  if (tp < 1 || pp < 1 || pp > layers || tp > (1 << 16)) return nullptr;
  std::vector<int> per;
  const int64_t first = num("decoder_first_pipeline_num_layers", -1), last = num("decoder_last_pipeline_num_layers", -1);
  if (pp > 1 && (first > 0 || last > 0)) {
    int64_t rest = layers - std::max<int64_t>(first, 0) - std::max<int64_t>(last, 0);
    const int64_t middle = pp - (first > 0) - (last > 0);
    if (rest < 0 || (middle == 0 && rest != 0) || (middle > 0 && rest % middle != 0)) return nullptr;
    for (int64_t s = 0; s < pp; ++s)
      per.push_back(static_cast<int>(s == 0 && first > 0 ? first : s == pp - 1 && last > 0 ? last : rest / middle));
  }
  auto l = Layout::make(static_cast<int>(tp), static_cast<int>(pp), 1, 0, static_cast<int>(layers), per);
  if (!l.ok()) return nullptr;
  l->vocab_divisor = num("make_vocab_size_divisible_by", 128);
  return l->to_json();
}

// The dp_reshardable buckets planned at the saved tp/pp (the vocabulary padded as saved); nullopt
// when there are none. Without a saved layout (vpp) the plan only names why it is not read.
Result<std::optional<DistOptimPlan>> plan_saved_buckets(const TensorSource& dcp, const LlamaConfig& cfg,
                                                        const nlohmann::json& saved_json, int64_t vpp,
                                                        const nlohmann::json& args, const std::string& dir,
                                                        int64_t padded_vocab) {
  Layout saved;
  if (!saved_json.is_null()) {
    CKPT_ASSIGN_OR_RETURN(saved, Layout::from_json(saved_json));
    if (padded_vocab % saved.tp == 0) saved.vocab_divisor = static_cast<int>(padded_vocab / saved.tp);
  } else if (vpp <= 1) {
    return Status::Error("BadDistOptimArgs", "'" + dir + "': the args give no tp/pp layout for the dp_reshardable buckets")
        .with_file(dir);
  }
  CKPT_ASSIGN_OR_RETURN(auto plan, plan_dp_reshardable(dcp, cfg, saved, vpp, args, dir));
  const torch::DcpMetadata* md = torch::dcp_metadata_of(dcp);
  if (plan || !md) return plan;
  return plan_dp_zero(*md, cfg, saved, vpp, args, dir);
}

// The planned bucket slices as pieces; every canonical tensor they name must be covered whole.
Status MegatronDistSource::add_dist_optim(DistOptimPlan plan) {
  std::map<std::string, int64_t> elems;
  for (DistOptimPiece& f : plan.pieces) {
    if (!canonical_shape_.count(f.tensor)) return Status::Internal("no canonical shape for '" + f.tensor + "'");
    elems[f.tensor] += f.box.numel();
    const DType dt = f.world >= 0 ? plan.worlds.at(f.world).tensor.storage.dtype : dcp_->tensors()[f.dcp_tensor].dtype;
    pieces_.push_back(Piece{f.tensor, Region{f.box}, dt});
    map_.push_back(Map{SIZE_MAX, 0, {}, {}, flat_.size()});
    flat_.push_back(std::move(f));
  }
  for (const auto& [name, n] : elems)
    if (n != Box::whole(canonical_shape_[name]).numel())
      return Status::Error("DistOptimRangeNotCovered", "'" + dir_ + "': the dp_reshardable buckets hold " + std::to_string(n) +
                                                           " elements of '" + name + "', not all " +
                                                           std::to_string(Box::whole(canonical_shape_[name]).numel()))
          .with_file(dir_)
          .with_tensor(name);
  read_.insert(plan.dcp_read.begin(), plan.dcp_read.end());
  read_.insert(plan.items_read.begin(), plan.items_read.end());
  worlds_ = std::move(plan.worlds);
  return Status::Ok();
}

Result<std::unique_ptr<TensorSource>> MegatronDistSource::open(const std::string& path) {
  auto dir = find_megatron_dist_dir(path);
  if (!dir) return Status::NotFound("'" + path + "' is not a Megatron-Core torch_dist checkpoint (metadata.json)");
  auto src = std::unique_ptr<MegatronDistSource>(new MegatronDistSource());
  src->dir_ = *dir;
  CKPT_ASSIGN_OR_RETURN(src->dcp_, torch::open_dcp_dir(*dir));
  for (size_t i = 0; i < src->dcp_->tensors().size(); ++i) src->dcp_tensor_[src->dcp_->tensors()[i].name] = i;
  for (size_t i = 0; i < src->dcp_->pieces().size(); ++i) src->dcp_pieces_[src->dcp_->pieces()[i].tensor].push_back(i);
  CKPT_ASSIGN_OR_RETURN(MegatronDistCommon common, read_megatron_dist_common(*dir, torch::dcp_metadata_of(*src->dcp_)));
  src->common_source_ = common.source;
  CKPT_ASSIGN_OR_RETURN(auto shapes, dist_shapes(*src->dcp_, *dir));
  const std::string args_file = common.source == "common.pt" ? *dir + "/common.pt" : *dir + " (item " + common.source + ")";
  CKPT_ASSIGN_OR_RETURN(LlamaConfig cfg, llama_config_from_megatron_args(common.args, shapes.second, args_file));
  if (cfg.num_hidden_layers != shapes.first)
    return Status::Error("ShapeMismatch", "'" + *dir + "': args.num_layers = " + std::to_string(cfg.num_hidden_layers) +
                                              ", the stacked tensors hold " + std::to_string(shapes.first) + " layers");
  cfg.tie_word_embeddings = !src->dcp_tensor_.count("output_layer.weight");
  // The canonical view does not depend on the saved TP/PP: map at tp = pp = 1, padded as saved.
  CKPT_ASSIGN_OR_RETURN(Layout layout, Layout::make(1, 1, 1, 0, static_cast<int>(cfg.num_hidden_layers), {}));
  layout.vocab_divisor = shapes.second;
  CKPT_ASSIGN_OR_RETURN(std::vector<DistTensor> map, megatron_dist_tensors(cfg, layout));
  const auto model = llama_model_tensors(cfg, DType::kF32);
  for (const auto& t : model) src->canonical_shape_[t.name] = t.shape;
  for (const auto& p : kDistOptimizerPrefixes)
    if (*p.canonical)
      for (const auto& t : model) src->canonical_shape_[p.canonical + t.name] = t.shape;
  const int64_t vpp = common.args.contains("virtual_pipeline_model_parallel_size") &&
                              common.args["virtual_pipeline_model_parallel_size"].is_number_integer()
                          ? common.args["virtual_pipeline_model_parallel_size"].get<int64_t>()
                          : 1;
  const nlohmann::json saved_json = saved_layout(common.args, cfg.num_hidden_layers);
  // An MoE model's dp_reshardable buckets (expert buffers over edp) are not read: listed as not imported.
  std::optional<DistOptimPlan> plan;
  if (!cfg.moe) {
    CKPT_ASSIGN_OR_RETURN(plan, plan_saved_buckets(*src->dcp_, cfg, saved_json, vpp, common.args, *dir, shapes.second));
  }
  const bool bucket_masters = plan && plan->not_imported_reason.empty();
  std::map<std::string, DType> dtype_of;
  for (const DistTensor& t : map) {
    const std::string key = moe_norm_key(t.key, cfg, src->dcp_tensor_);
    std::string weights = key;
    // fp32 masters replace the weights: optimizer.state.fp32_param (FP32/Float16 optimizers) or
    // optimizer.state.param (the distributed optimizer's fully_reshardable form).
    for (const char* master : {kDistOptimizerPrefixes[0].dist, kDistMasterParamPrefix})
      if (weights == key && src->dcp_tensor_.count(master + key)) weights = master + key;
    if (!src->dcp_tensor_.count(weights))
      return Status::Error("MissingTensor", "'" + *dir + "' has no tensor '" + t.key + "'").with_file(*dir);
    src->read_.insert(key);
    // dp_reshardable masters (added below) replace the weights too.
    if (!bucket_masters) CKPT_RETURN_IF_ERROR(src->add_tensor(t, weights, ""));
    for (size_t k = 1; k < std::size(kDistOptimizerPrefixes); ++k) {
      const std::string n = std::string(kDistOptimizerPrefixes[k].dist) + key;
      if (src->dcp_tensor_.count(n)) CKPT_RETURN_IF_ERROR(src->add_tensor(t, n, kDistOptimizerPrefixes[k].canonical));
    }
  }
  std::string bucket_reason;
  if (plan) bucket_reason = plan->not_imported_reason;
  if (bucket_masters) CKPT_RETURN_IF_ERROR(src->add_dist_optim(std::move(*plan)));
  for (const auto& p : src->pieces_) dtype_of.emplace(p.tensor, p.dtype);
  for (const auto& [name, dt] : dtype_of) src->tensors_.push_back(TensorMeta{name, dt, src->canonical_shape_[name]});
  nlohmann::json mg = {{"tp", common.args.value("tensor_model_parallel_size", 1)},
                       {"pp", common.args.value("pipeline_model_parallel_size", 1)}};
  if (common.iteration) mg["iteration"] = *common.iteration;
  if (common.optimizer_step) mg["optimizer_step"] = *common.optimizer_step;
  if (!common.adam.empty()) mg["adam"] = common.adam;
  if (!common.opt_param_scheduler.empty()) mg["opt_param_scheduler"] = common.opt_param_scheduler;
  if (!common.sharding_type.empty()) mg["optimizer_sharding_type"] = common.sharding_type;
  src->meta_ = {{"model_config", cfg.to_json()}, {"megatron_args", common.args}, {"megatron", mg}};
  // A virtual pipeline's stages hold interleaved chunks, which a layout cannot say: no layout then.
  if (vpp > 1) src->meta_["megatron"]["virtual_pipeline"] = vpp;
  else if (!saved_json.is_null()) src->meta_["layout"] = saved_json;
  std::vector<std::string> not_read;
  for (const auto& t : src->dcp_->tensors())
    if (t.name.rfind("optimizer.", 0) == 0 && !src->read_.count(t.name)) not_read.push_back(t.name);
  if (const torch::DcpMetadata* md = torch::dcp_metadata_of(*src->dcp_))
    for (const auto& b : md->bytes) {
      // dp_reshardable's per_bucket_numel(_unpadded) are checked as the buckets' sizes; its
      // param_groups items (.optimizer) gave the step, if any, and the hyper-parameters
      // (read_megatron_dist_common).
      const bool used = bucket_masters && (b.fqn.find(".per_bucket_numel") != std::string::npos ||
                                           (common.groups_read && b.fqn.find(".optimizer/shard_") != std::string::npos));
      if (b.fqn.rfind("optimizer.", 0) == 0 && !used && !src->read_.count(b.fqn)) not_read.push_back(b.fqn);
    }
  src->note_not_imported(not_read, common.sharding_type, bucket_reason);
  return std::unique_ptr<TensorSource>(std::move(src));
}

}  // namespace dist_source_detail

bool is_megatron_dist_dir(const std::string& path) { return find_megatron_dist_dir(path).has_value(); }

Result<std::unique_ptr<TensorSource>> open_megatron_dist(const std::string& path) {
  return dist_source_detail::MegatronDistSource::open(path);
}

}  // namespace ckpt
