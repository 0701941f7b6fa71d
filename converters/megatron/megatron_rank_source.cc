#include "converters/megatron/megatron_rank_source.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <vector>

#include "converters/megatron/megatron_moe_args.h"
#include "converters/megatron/megatron_segments.h"
#include "converters/megatron/megatron_torch_optim.h"
#include "converters/model/llama_sharding.h"

namespace ckpt {

namespace {

Status bad_args(const std::string& file, const std::string& msg) {
  return Status::Error("BadMegatronArgs", "'" + file + "': " + msg).with_file(file);
}

Result<int64_t> args_int(const nlohmann::json& j, const std::string& file, const char* key, int64_t lo, int64_t hi) {
  if (!j.contains(key) || j.at(key).is_null()) return bad_args(file, std::string("key '") + key + "' is missing");
  if (!j.at(key).is_number_integer())
    return bad_args(file, std::string("key '") + key + "' must be an integer, found " + j.at(key).dump().substr(0, 64));
  const int64_t v = j.at(key).get<int64_t>();
  if (v < lo || v > hi)
    return bad_args(file, std::string("key '") + key + "' = " + std::to_string(v) + " outside " + std::to_string(lo) +
                              ".." + std::to_string(hi));
  return v;
}



// The config fields of the args, and the parallel sizes (tp, pp, vocab divisor).
Status read_args_config(const nlohmann::json& j, const std::string& args_file, LlamaConfig& c, int64_t& tp,
                        int64_t& pp, int64_t& divisor) {
  constexpr int64_t kBig = int64_t{1} << 40;
  CKPT_ASSIGN_OR_RETURN(tp, args_int(j, args_file, "tensor_model_parallel_size", 1, 1 << 16));
  CKPT_ASSIGN_OR_RETURN(pp, args_int(j, args_file, "pipeline_model_parallel_size", 1, 1 << 16));
  CKPT_ASSIGN_OR_RETURN(c.num_hidden_layers, args_int(j, args_file, "num_layers", 1, 1 << 20));
  CKPT_ASSIGN_OR_RETURN(c.hidden_size, args_int(j, args_file, "hidden_size", 1, kBig));
  CKPT_ASSIGN_OR_RETURN(c.intermediate_size, args_int(j, args_file, "ffn_hidden_size", 1, kBig));
  CKPT_ASSIGN_OR_RETURN(c.num_attention_heads, args_int(j, args_file, "num_attention_heads", 1, 1 << 20));
  CKPT_ASSIGN_OR_RETURN(c.num_key_value_heads, args_int(j, args_file, "num_query_groups", 1, 1 << 20));
  CKPT_ASSIGN_OR_RETURN(c.head_dim, args_int(j, args_file, "kv_channels", 1, 1 << 20));
  CKPT_ASSIGN_OR_RETURN(c.vocab_size, args_int(j, args_file, "vocab_size", 1, kBig));
  CKPT_ASSIGN_OR_RETURN(divisor, args_int(j, args_file, "make_vocab_size_divisible_by", 1, 1 << 20));
  if (!j.contains("untie_embeddings_and_output_weights") || !j["untie_embeddings_and_output_weights"].is_boolean())
    return bad_args(args_file, "key 'untie_embeddings_and_output_weights' must be a boolean");
  c.tie_word_embeddings = !j["untie_embeddings_and_output_weights"].get<bool>();
  if (j.contains("swiglu") && j["swiglu"] != true) return Status::Unsupported("'" + args_file + "': swiglu is false");
  // LLaMA settings only: RMSNorm, rotary embeddings in HF's rotate-half form.
  for (const auto& [key, want] : {std::pair<const char*, const char*>{"normalization", "RMSNorm"},
                                  {"position_embedding_type", "rope"}})
    if (j.contains(key) && j[key].is_string() && j[key] != want)
      return Status::Unsupported("'" + args_file + "': " + key + " is " + j[key].get<std::string>() + ", ckpt reads " + want);
  if (j.contains("rotary_interleaved") && j["rotary_interleaved"] == true)
    return Status::Unsupported("'" + args_file + "': rotary_interleaved is true (HF LLaMA rotates halves)");
  if (j.contains("norm_epsilon") && j["norm_epsilon"].is_number()) c.rms_norm_eps = j["norm_epsilon"].get<double>();
  if (j.contains("rotary_base") && j["rotary_base"].is_number()) c.rope_theta = j["rotary_base"].get<double>();
  if (j.contains("max_position_embeddings") && j["max_position_embeddings"].is_number_integer())
    c.max_position_embeddings = j["max_position_embeddings"].get<int64_t>();
  return Status::Ok();
}

}  // namespace

Result<MegatronArgs> megatron_args_from_json(nlohmann::json j, const std::string& args_file) {
  if (!j.is_object()) return bad_args(args_file, "not a JSON object");
  MegatronArgs a;
  int64_t tp = 0, pp = 0, divisor = 0;
  CKPT_RETURN_IF_ERROR(read_args_config(j, args_file, a.config, tp, pp, divisor));
  std::vector<int> per;
  if (j.contains("layers_per_stage")) {
    if (!j["layers_per_stage"].is_array() || j["layers_per_stage"].size() != static_cast<size_t>(pp))
      return bad_args(args_file, "'layers_per_stage' must be an array of pp integers");
    for (const auto& e : j["layers_per_stage"]) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() > (1 << 20))
        return bad_args(args_file, "'layers_per_stage' holds a bad entry " + e.dump());
      per.push_back(static_cast<int>(e.get<int64_t>()));
    }
  }
  auto lay = Layout::make(static_cast<int>(tp), static_cast<int>(pp), 1, 0,
                          static_cast<int>(a.config.num_hidden_layers), per);
  if (!lay.ok()) return lay.take_status().with_file(args_file);
  a.layout = std::move(lay).value();
  a.layout.vocab_divisor = divisor;
  if (megatron_args_moe(j)) CKPT_RETURN_IF_ERROR(megatron_moe_from_args(j, args_file, a.config, a.layout));
  a.json = std::move(j);
  return a;
}

namespace {

class MegatronRankSource final : public TensorSource {
 public:
  const std::vector<TensorMeta>& tensors() const override { return tensors_; }
  const std::vector<Piece>& pieces() const override { return pieces_; }
  const nlohmann::json& metadata() const override { return meta_; }
  std::string describe() const override { return describe_; }

  Status read(size_t piece, const Box& sub, void* dst) override {
    if (piece >= pieces_.size()) return Status::Internal("Megatron piece " + std::to_string(piece) + " out of range");
    const Box& seg = pieces_[piece].region.box;
    if (!seg.contains(sub) || sub.ndim() != seg.ndim())
      return Status::Internal("read of " + sub.to_string() + " outside Megatron segment " + seg.to_string());
    if (sub.numel() == 0) return Status::Ok();
    return files_[map_[piece].file]->read(map_[piece].inner, rank_box(piece, sub), dst);
  }
  // The rank file's range when it holds the segment's bytes as they are (file-to-file copies).
  std::optional<FileExtent> file_extent(size_t piece, const Box& sub) override {
    if (piece >= pieces_.size() || sub.ndim() != pieces_[piece].region.box.ndim() || !pieces_[piece].region.box.contains(sub))
      return std::nullopt;
    return files_[map_[piece].file]->file_extent(map_[piece].inner, rank_box(piece, sub));
  }

  IntegrityInfo integrity() const override { return integrity_; }

  // Every rank file's own check (its units numbered per file), failures mapped to the first piece
  // of this view over the file's piece; progress over the files' sizes on disk.
  CheckReport check(const CheckOptions& o) override {
    CheckReport rep;
    uint64_t total = 0, before = 0;
    std::error_code ec;
    for (const std::string& n : names_) total += std::filesystem::file_size(n, ec) * !ec;
    for (size_t f = 0; f < files_.size(); ++f) {
      CheckOptions fo = o;
      uint64_t last = 0;
      if (o.progress)
        fo.progress = [&](uint64_t done, uint64_t) {
          last = done;
          o.progress(std::min(total, before + done), std::max(total, before + done));
        };
      CheckReport r = files_[f]->check(fo);
      before += last;
      rep.pieces += r.pieces;
      rep.bytes += r.bytes;
      for (CheckFailure& x : r.failures) {
        if (x.piece != CheckFailure::kNoPiece) x.piece = outer_piece(f, x.piece);
        if (x.file.empty()) x.file = names_[f];
        rep.failures.push_back(std::move(x));
      }
    }
    return rep;
  }
  Status check_piece(size_t piece) override {
    if (piece >= pieces_.size()) return Status::InvalidArgument("piece index " + std::to_string(piece) + " out of range");
    return files_[map_[piece].file]->check_piece(map_[piece].inner);
  }

  static Result<std::unique_ptr<TensorSource>> open(std::string describe, MegatronArgs a, MegatronRankFiles ranks,
                                                   nlohmann::json extra_meta) {
    auto src = std::unique_ptr<MegatronRankSource>(new MegatronRankSource());
    src->describe_ = std::move(describe);
    LlamaConfig& c = a.config;
    const Layout& layout = a.layout;
    if (ranks.parts.empty())
      for (int p = 0; p < layout.pp; ++p)
        for (int r = 0; r < layout.tp; ++r) ranks.parts.push_back({r, p, {}});
    const size_t nfiles = ranks.parts.size();
    if (ranks.files.size() != nfiles || ranks.paths.size() != nfiles)
      return Status::Internal("Megatron source '" + src->describe_ + "' given " + std::to_string(ranks.files.size()) +
                              " rank files for tp*pp = " + std::to_string(nfiles));
    src->files_ = std::move(ranks.files);
    src->names_ = std::move(ranks.paths);
    src->integrity_ = ranks.integrity.format.empty() && !src->files_.empty() ? src->files_[0]->integrity() : ranks.integrity;
    // Biases and norm naming are read off rank (0, 0)'s tensor names.
    auto has = [&](const std::string& n) {
      for (const auto& t : src->files_[0]->tensors())
        if (t.name == n) return true;
      return false;
    };
    c.attention_bias = has("decoder.layers.0.self_attention.linear_qkv.bias");
    if (c.family == ModelFamily::kQwen2Moe) {  // q/k/v biases without o_proj's
      c.extra["qkv_bias"] = c.attention_bias;
      c.attention_bias = has("decoder.layers.0.self_attention.linear_proj.bias");
    }
    c.mlp_bias = has("decoder.layers.0.mlp.linear_fc1.bias");
    const MegatronNormNames norms = has("decoder.layers.0.input_layernorm.weight") ? MegatronNormNames::kLocal
                                                                                    : MegatronNormNames::kTransformerEngine;
    // Validate the config the usual way (H divisible by K, even head_dim, ...).
    auto cv = LlamaConfig::from_json(c.to_json());
    if (!cv.ok()) return cv.take_status().with_file(src->names_[0]);
    c = std::move(cv).value();
    CKPT_RETURN_IF_ERROR(layout.as_symmetric("a Megatron-layout directory").status());
    CKPT_RETURN_IF_ERROR(LlamaShardingRules(c).check_layout(layout));
    std::map<std::string, DType> dtype_of;
    for (size_t fi = 0; fi < nfiles; ++fi) CKPT_RETURN_IF_ERROR(src->add_rank(c, layout, fi, ranks.parts[fi], norms, dtype_of));
    // The weights, then each optimizer kind every rank holds.
    std::vector<std::string> prefixes = {""};
    for (size_t k = 0; k < std::size(kMegatronOptimPrefixes); ++k)
      if (src->kinds_ & (1u << k)) prefixes.push_back(kMegatronOptimPrefixes[k]);
    for (const std::string& prefix : prefixes)
      for (TensorMeta t : llama_model_tensors(c, DType::kF32)) {
        t.name = prefix + t.name;
        auto it = dtype_of.find(t.name);
        if (it == dtype_of.end()) return Status::Internal("Megatron layout never holds '" + t.name + "'");
        t.dtype = it->second;
        src->tensors_.push_back(std::move(t));
      }
    if (!src->tensors_.empty()) c.dtype = src->tensors_.front().dtype;
    src->meta_ = {{"model_config", c.to_json()}, {"layout", layout.to_json()}, {"megatron_args", a.json}};
    if (src->moe_optimizer_skipped_)
      src->meta_["megatron_moe_optimizer_not_imported"] =
          "the optimizer state of a mixture-of-experts model is not imported yet (weights only; docs/MOE.md)";
    if (extra_meta.is_object())
      for (auto& [k, v] : extra_meta.items()) {
        if (v.is_null()) src->meta_.erase(k);
        else src->meta_[k] = v;
      }
    return std::unique_ptr<TensorSource>(std::move(src));
  }

 private:
  struct Map {
    size_t file;       // index into files_
    size_t inner;      // piece index of the Megatron tensor in that file
    int64_t row_off;   // first row of the segment inside the Megatron tensor
    bool expert;       // the segment's box has a leading expert dim the Megatron tensor has not
  };

  MegatronRankSource() = default;

  // The first piece of this view read from piece `inner` of file `file`; kNoPiece when none (a
  // padding-only or unmapped tensor).
  size_t outer_piece(size_t file, size_t inner) const {
    for (size_t i = 0; i < map_.size(); ++i)
      if (map_[i].file == file && map_[i].inner == inner) return i;
    return CheckFailure::kNoPiece;
  }

  // `sub` (inside piece `piece`'s segment) in the coordinates of the rank file's tensor.
  Box rank_box(size_t piece, const Box& sub) const {
    const Box& seg = pieces_[piece].region.box;
    const size_t skip = map_[piece].expert ? 1 : 0;  // an expert's [1, rows, cols] is the file's [rows, cols]
    Box inner;
    for (size_t d = skip; d < sub.ndim(); ++d) {
      inner.offset.push_back(sub.offset[d] - seg.offset[d] + (d == skip ? map_[piece].row_off : 0));
      inner.extent.push_back(sub.extent[d]);
    }
    return inner;
  }

  // Checks rank (r, p)'s file against the segment map and adds a piece per segment, for the
  // weights and for each optimizer kind (converters/megatron/megatron_torch_optim.h) the file holds: a kind
  // is held for every parameter or for none, and by every rank file or by none.
  Status add_rank(const LlamaConfig& c, const Layout& layout, size_t fi, const MegatronFilePart& fp,
                  MegatronNormNames norms, std::map<std::string, DType>& dtype_of) {
    const TensorSource& f = *files_[fi];
    const std::string& name = names_[fi];
    std::map<std::string, size_t> in_file;
    unsigned kinds = 0;
    for (size_t k = 0; k < f.tensors().size(); ++k) {
      in_file[f.tensors()[k].name] = k;
      for (size_t o = 0; o < std::size(kMegatronOptimPrefixes); ++o)
        if (f.tensors()[k].name.rfind(kMegatronOptimPrefixes[o], 0) == 0) kinds |= 1u << o;
    }
    if (c.moe && kinds != 0) {  // an MoE model's optimizer state is not imported (docs/MOE.md): weights only
      moe_optimizer_skipped_ = true;
      kinds = 0;
    }
    if (fi == 0) kinds_ = kinds;
    if (kinds != kinds_)
      return Status::Error("MegatronOptimizerMissingMoment", "'" + name + "' holds optimizer state kinds " +
                                                                  kinds_string(kinds) + ", '" + names_[0] + "' holds " +
                                                                  kinds_string(kinds_))
          .with_file(name);
    CKPT_ASSIGN_OR_RETURN(auto expected, megatron_rank_tensors(c, layout, fp.tp_rank, fp.pp_rank, norms, fp.part));
    if (c.moe && fp.part.experts) CKPT_RETURN_IF_ERROR(check_local_experts(f, name, c.moe->num_experts / layout.ep));
    for (const MegatronTensor& t : expected) {
      CKPT_RETURN_IF_ERROR(add_tensor(fi, t, "", in_file, dtype_of));
      for (size_t o = 0; o < std::size(kMegatronOptimPrefixes); ++o)
        if (kinds & (1u << o)) CKPT_RETURN_IF_ERROR(add_tensor(fi, t, kMegatronOptimPrefixes[o], in_file, dtype_of));
    }
    return Status::Ok();
  }

  // A file holding more local experts than num_experts / ep (another expert parallel size).
  static Status check_local_experts(const TensorSource& f, const std::string& name, int64_t local) {
    for (const auto& t : f.tensors()) {
      std::string key = ".mlp.experts.local_experts.";  // SequentialMLP, or TEGroupedMLP's linear_fc{1,2}.weight{j}
      size_t at = t.name.find(key);
      for (const char* g : {".mlp.experts.linear_fc1.weight", ".mlp.experts.linear_fc2.weight"})
        if (at == std::string::npos && (at = t.name.find(g)) != std::string::npos) key = g;
      if (at == std::string::npos) continue;
      const size_t b = at + key.size(), e = t.name.find('.', b);
      const std::string num = t.name.substr(b, e == std::string::npos ? std::string::npos : e - b);
      if (num.empty() || num.size() > 6 || num.find_first_not_of("0123456789") != std::string::npos ||
          std::stoll(num) >= local)
        return Status::Error("MegatronExpertCountMismatch", "'" + name + "' holds '" + t.name + "'; the args (num_experts / "
                                                            "expert_model_parallel_size) give each expert rank " +
                                                            std::to_string(local) + " local experts")
            .with_file(name).with_tensor(t.name);
    }
    return Status::Ok();
  }

  static std::string kinds_string(unsigned kinds) {
    std::string s;
    for (size_t o = 0; o < std::size(kMegatronOptimPrefixes); ++o)
      if (kinds & (1u << o)) s += std::string(s.empty() ? "" : ", ") + kMegatronOptimPrefixes[o] + "*";
    return s.empty() ? "(none)" : "{" + s + "}";
  }

  // Megatron tensor `t` (with `prefix`: its optimizer tensor) of file `fi`: present with t's
  // shape; a piece per segment of the canonical tensor prefix + segment tensor.
  Status add_tensor(size_t fi, const MegatronTensor& t, const std::string& prefix,
                    const std::map<std::string, size_t>& in_file, std::map<std::string, DType>& dtype_of) {
    const TensorSource& f = *files_[fi];
    const std::string& name = names_[fi];
    const std::string tname = prefix + t.name;
    auto it = in_file.find(tname);
    if (it == in_file.end())
      return Status::Error(prefix.empty() ? "MissingTensor" : "MegatronOptimizerMissingMoment",
                           "'" + name + "' has no tensor '" + tname + "'")
          .with_file(name).with_tensor(tname);
    const TensorMeta& got = f.tensors()[it->second];
    if (got.shape != t.shape)
      return Status::Error("ShapeMismatch", "'" + name + "': tensor '" + tname + "' has shape " +
                                                shape_to_string(got.shape) + ", the args imply " + shape_to_string(t.shape))
          .with_file(name).with_tensor(tname);
    // The file's piece of this tensor (one whole piece per tensor).
    size_t inner = f.pieces().size();
    for (size_t k = 0; k < f.pieces().size(); ++k)
      if (f.pieces()[k].tensor == tname) inner = k;
    if (inner == f.pieces().size()) return Status::Internal("no piece for '" + tname + "' in " + name);
    int64_t row = 0;
    for (const MegatronSegment& sg : t.segments) {
      if (!sg.tensor.empty()) {
        const std::string canon = prefix + sg.tensor;
        auto [dt, fresh] = dtype_of.emplace(canon, got.dtype);
        if (!fresh && dt->second != got.dtype)
          return Status::Error("DTypeMismatch", "'" + name + "': tensor '" + tname + "' is " +
                                                    std::string(dtype_name(got.dtype)) + ", another rank holds '" +
                                                    canon + "' as " + std::string(dtype_name(dt->second)))
              .with_file(name);
        pieces_.push_back({canon, Region{sg.box}, got.dtype});
        map_.push_back({fi, inner, row, sg.expert});
      }
      row += sg.rows();
    }
    return Status::Ok();
  }

  std::string describe_;
  std::vector<std::unique_ptr<TensorSource>> files_;  // index pp_rank * tp + tp_rank
  std::vector<std::string> names_;  // path of each file, for messages
  std::vector<TensorMeta> tensors_;
  std::vector<Piece> pieces_;
  std::vector<Map> map_;
  IntegrityInfo integrity_;
  unsigned kinds_ = 0;  // bit k: every rank file holds kMegatronOptimPrefixes[k] tensors
  bool moe_optimizer_skipped_ = false;
  nlohmann::json meta_;
};

}  // namespace

Result<std::unique_ptr<TensorSource>> open_megatron_ranks(std::string describe, MegatronArgs args,
                                                          MegatronRankFiles ranks, nlohmann::json extra_meta) {
  return MegatronRankSource::open(std::move(describe), std::move(args), std::move(ranks), std::move(extra_meta));
}

}  // namespace ckpt
