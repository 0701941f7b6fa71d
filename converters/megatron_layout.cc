#include "converters/megatron_layout.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <system_error>

#include "converters/llama_sharding.h"
#include "formats/json_read.h"
#include "formats/safetensors/st_reader.h"
#include "formats/safetensors/st_writer.h"
#include "formats/store/fs_util.h"
#include "reshard/executor.h"

namespace ckpt {

namespace {

// Box of rows [begin, end) of dim `dim` of `shape`, full in every other dimension.
Box rows_of(const Shape& shape, size_t dim, int64_t begin, int64_t end) {
  Box b = Box::whole(shape);
  b.offset[dim] = begin;
  b.extent[dim] = end - begin;
  return b;
}

MegatronSegment seg(const std::string& tensor, Box box) { return MegatronSegment{tensor, std::move(box), 0}; }

// Builds a tensor from segments, computing dim 0 as the sum of the segments' rows.
MegatronTensor make(std::string name, Shape trailing, std::vector<MegatronSegment> segs) {
  int64_t rows = 0;
  for (const auto& s : segs) rows += s.rows();
  Shape shape{rows};
  shape.insert(shape.end(), trailing.begin(), trailing.end());
  return MegatronTensor{std::move(name), std::move(shape), std::move(segs)};
}

Status refuse(ErrorKind kind, const std::string& msg) {
  return Status::Error(kind == ErrorKind::kUnsupported ? "LayoutUnsupported" : "LayoutRefused", msg);
}

}  // namespace

std::string megatron_rank_dir(const Layout& layout, int tp_rank, int pp_rank) {
  char buf[48];
  if (layout.pp == 1) std::snprintf(buf, sizeof buf, "mp_rank_%02d", tp_rank);
  else std::snprintf(buf, sizeof buf, "mp_rank_%02d_%03d", tp_rank, pp_rank);
  return buf;
}

Result<std::vector<MegatronTensor>> megatron_rank_tensors(const LlamaConfig& c, const Layout& layout, int tp_rank,
                                                          int pp_rank, MegatronNormNames norms) {
  const int tp = layout.tp, pp = layout.pp;
  const int64_t L = c.num_hidden_layers, H = c.num_attention_heads, K = c.num_key_value_heads,
                hd = c.head_dim, h = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  if (tp < 1 || pp < 1 || tp_rank < 0 || tp_rank >= tp || pp_rank < 0 || pp_rank >= pp)
    return Status::InvalidArgument("rank tp=" + std::to_string(tp_rank) + " pp=" + std::to_string(pp_rank) +
                                   " outside layout tp=" + std::to_string(tp) + " pp=" + std::to_string(pp));
  if (static_cast<int64_t>(layout.stage_of_layer.size()) != L)
    return refuse(ErrorKind::kInvalidArgument, "layout has " + std::to_string(layout.stage_of_layer.size()) +
                                                   " layers, the config has " + std::to_string(L));
  if (K % tp != 0)
    return refuse(ErrorKind::kUnsupported,
                  "Megatron needs tp to divide num_query_groups: tp=" + std::to_string(tp) +
                      ", num_key_value_heads=" + std::to_string(K));
  if (H % tp != 0 || I % tp != 0)
    return refuse(ErrorKind::kInvalidArgument, "tp=" + std::to_string(tp) + " must divide num_attention_heads=" +
                                                   std::to_string(H) + " and intermediate_size=" + std::to_string(I));
  const int64_t P = layout.padded_vocab(V);
  if (P < V || P % tp != 0)
    return Status::Internal("padded vocab " + std::to_string(P) + " for vocab " + std::to_string(V));
  const int64_t vpart = P / tp;

  // Vocab-parallel tensor of this TP rank: real rows, then zero padding up to P/tp rows.
  auto vocab_tensor = [&](const std::string& mname, const std::string& hf) {
    const int64_t b = std::min<int64_t>(tp_rank * vpart, V), e = std::min<int64_t>((tp_rank + 1) * vpart, V);
    std::vector<MegatronSegment> segs;
    if (e > b) segs.push_back(seg(hf, rows_of({V, h}, 0, b, e)));
    if (vpart - (e - b) > 0) segs.push_back(MegatronSegment{"", Box{}, vpart - (e - b)});
    return make(mname, {h}, std::move(segs));
  };

  std::vector<MegatronTensor> out;
  if (pp_rank == 0) out.push_back(vocab_tensor("embedding.word_embeddings.weight", "model.embed_tokens.weight"));

  int64_t local = 0;
  const int64_t groups_per_rank = K / tp, q_per_group = H / K;
  for (int64_t i = 0; i < L; ++i) {
    if (layout.stage_of_layer[i] != pp_rank) continue;
    const std::string hf = "model.layers." + std::to_string(i) + ".";
    const std::string mg = "decoder.layers." + std::to_string(local++) + ".";
    const bool te = norms == MegatronNormNames::kTransformerEngine;
    out.push_back(make(mg + (te ? "self_attention.linear_qkv.layer_norm_weight" : "input_layernorm.weight"), {},
                       {seg(hf + "input_layernorm.weight", Box::whole({h}))}));
    // linear_qkv: per query group g of this rank, [q heads of g; k_g; v_g].
    for (const char* kind : {"weight", "bias"}) {
      const bool w = std::string(kind) == "weight";
      if (!w && !c.attention_bias) continue;
      std::vector<MegatronSegment> segs;
      for (int64_t g = tp_rank * groups_per_rank; g < (tp_rank + 1) * groups_per_rank; ++g) {
        Shape qs = w ? Shape{H * hd, h} : Shape{H * hd}, ks = w ? Shape{K * hd, h} : Shape{K * hd};
        segs.push_back(seg(hf + "self_attn.q_proj." + kind, rows_of(qs, 0, g * q_per_group * hd, (g + 1) * q_per_group * hd)));
        segs.push_back(seg(hf + "self_attn.k_proj." + kind, rows_of(ks, 0, g * hd, (g + 1) * hd)));
        segs.push_back(seg(hf + "self_attn.v_proj." + kind, rows_of(ks, 0, g * hd, (g + 1) * hd)));
      }
      out.push_back(make(mg + "self_attention.linear_qkv." + kind, w ? Shape{h} : Shape{}, std::move(segs)));
    }
    // linear_proj: row-parallel, columns of o_proj; bias replicated.
    const int64_t qcols = H * hd / tp;
    out.push_back(make(mg + "self_attention.linear_proj.weight", {qcols},
                       {seg(hf + "self_attn.o_proj.weight", rows_of({h, H * hd}, 1, tp_rank * qcols, (tp_rank + 1) * qcols))}));
    if (c.attention_bias)
      out.push_back(make(mg + "self_attention.linear_proj.bias", {}, {seg(hf + "self_attn.o_proj.bias", Box::whole({h}))}));
    out.push_back(make(mg + (te ? "mlp.linear_fc1.layer_norm_weight" : "pre_mlp_layernorm.weight"), {},
                       {seg(hf + "post_attention_layernorm.weight", Box::whole({h}))}));
    // linear_fc1: [gate_r; up_r].
    const int64_t ip = I / tp;
    for (const char* kind : {"weight", "bias"}) {
      const bool w = std::string(kind) == "weight";
      if (!w && !c.mlp_bias) continue;
      Shape s = w ? Shape{I, h} : Shape{I};
      out.push_back(make(mg + "mlp.linear_fc1." + kind, w ? Shape{h} : Shape{},
                         {seg(hf + "mlp.gate_proj." + kind, rows_of(s, 0, tp_rank * ip, (tp_rank + 1) * ip)),
                          seg(hf + "mlp.up_proj." + kind, rows_of(s, 0, tp_rank * ip, (tp_rank + 1) * ip))}));
    }
    out.push_back(make(mg + "mlp.linear_fc2.weight", {ip},
                       {seg(hf + "mlp.down_proj.weight", rows_of({h, I}, 1, tp_rank * ip, (tp_rank + 1) * ip))}));
    if (c.mlp_bias)
      out.push_back(make(mg + "mlp.linear_fc2.bias", {}, {seg(hf + "mlp.down_proj.bias", Box::whole({h}))}));
  }
  if (local == 0)
    return refuse(ErrorKind::kInvalidArgument, "pipeline stage " + std::to_string(pp_rank) + " holds no layer");

  if (pp_rank == pp - 1) {
    out.push_back(make("decoder.final_layernorm.weight", {}, {seg("model.norm.weight", Box::whole({h}))}));
    if (!c.tie_word_embeddings) out.push_back(vocab_tensor("output_layer.weight", "lm_head.weight"));
    else if (pp > 1) out.push_back(vocab_tensor("output_layer.weight", "model.embed_tokens.weight"));
  }
  return out;
}

nlohmann::json megatron_args(const LlamaConfig& c, const Layout& layout) {
  nlohmann::json j;
  j["tensor_model_parallel_size"] = layout.tp;
  j["pipeline_model_parallel_size"] = layout.pp;
  j["tp"] = layout.tp;
  j["pp"] = layout.pp;
  j["num_layers"] = c.num_hidden_layers;
  std::vector<int> per_stage;
  for (int s = 0; s < layout.pp; ++s)
    per_stage.push_back(static_cast<int>(std::count(layout.stage_of_layer.begin(), layout.stage_of_layer.end(), s)));
  j["layers_per_stage"] = per_stage;
  j["hidden_size"] = c.hidden_size;
  j["hidden"] = c.hidden_size;
  j["ffn_hidden_size"] = c.intermediate_size;
  j["num_attention_heads"] = c.num_attention_heads;
  j["heads"] = c.num_attention_heads;
  j["group_query_attention"] = c.num_key_value_heads != c.num_attention_heads;
  j["num_query_groups"] = c.num_key_value_heads;
  j["kv_channels"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["padded_vocab_size"] = layout.padded_vocab(c.vocab_size);
  j["make_vocab_size_divisible_by"] = layout.vocab_divisor;
  j["swiglu"] = true;
  j["untie_embeddings_and_output_weights"] = !c.tie_word_embeddings;
  j["add_qkv_bias"] = c.attention_bias;
  j["add_bias_linear"] = c.attention_bias || c.mlp_bias;
  j["normalization"] = "RMSNorm";
  j["norm_epsilon"] = c.rms_norm_eps;
  j["rotary_base"] = c.rope_theta;
  j["position_embedding_type"] = "rope";
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["checkpoint_version"] = 3.0;
  return j;
}

namespace {

namespace fs = std::filesystem;

// Streams one Megatron tensor (segment by segment, row chunks) into piece `piece` of `sink`.
Status write_megatron_tensor(TensorSource& src, const SourceIndex& index, const MegatronTensor& t, DType dtype,
                             size_t piece, TensorSink& sink, uint64_t chunk_bytes, std::vector<unsigned char>& buf) {
  const size_t es = dtype_size(dtype);
  int64_t row_elems = 1;
  for (size_t d = 1; d < t.shape.size(); ++d) row_elems *= t.shape[d];
  const int64_t rows_per_chunk =
      std::max<int64_t>(1, static_cast<int64_t>(chunk_bytes / std::max<uint64_t>(1, row_elems * es)));
  buf.resize(static_cast<size_t>(rows_per_chunk * row_elems) * es);
  for (const auto& sg : t.segments) {
    const int64_t rows = sg.rows();
    for (int64_t r0 = 0; r0 < rows; r0 += rows_per_chunk) {
      const int64_t nr = std::min(rows_per_chunk, rows - r0);
      const int64_t count = nr * row_elems;
      if (sg.tensor.empty()) {
        std::fill(buf.begin(), buf.begin() + static_cast<ptrdiff_t>(count * es), 0);
      } else {
        Box sub = sg.box;
        sub.offset[0] += r0;
        sub.extent[0] = nr;
        Status s = read_global_box(src, index, sg.tensor, sub, dtype, buf.data());
        if (!s.ok()) return std::move(s).with_tensor(sg.tensor).with_context("building " + t.name);
      }
      CKPT_RETURN_IF_ERROR(sink.write(piece, buf.data(), count));
    }
  }
  return Status::Ok();
}

}  // namespace

Status export_megatron(TensorSource& src, const std::string& dst, const MegatronExportOptions& opts) {
  const nlohmann::json& meta = src.metadata();
  if (!meta.is_object() || !meta.contains("model_config"))
    return Status::NotFound("source '" + src.describe() +
                            "' carries no model config (config.json / manifest model_config); export-megatron needs it");
  CKPT_ASSIGN_OR_RETURN(LlamaConfig cfg, LlamaConfig::from_json(meta["model_config"]));
  if (cfg.num_hidden_layers > (1 << 20)) return Status::Unsupported("more than 2^20 layers");
  CKPT_ASSIGN_OR_RETURN(Layout layout, Layout::make(opts.tp, opts.pp, 1, 0, static_cast<int>(cfg.num_hidden_layers),
                                                    opts.layers_per_stage));
  layout.vocab_divisor = opts.vocab_divisor;
  CKPT_RETURN_IF_ERROR(LlamaShardingRules(cfg).check_layout(layout));

  // Every rank's tensors, computed (and refused) before anything is written.
  std::vector<std::vector<MegatronTensor>> ranks;  // index pp * tp + tp_rank
  for (int p = 0; p < layout.pp; ++p)
    for (int r = 0; r < layout.tp; ++r) {
      CKPT_ASSIGN_OR_RETURN(auto ts, megatron_rank_tensors(cfg, layout, r, p, opts.norms));
      ranks.push_back(std::move(ts));
    }
  // Every canonical tensor needed: present with the config's shape.
  CKPT_ASSIGN_OR_RETURN(SourceIndex index, SourceIndex::build(src));
  std::map<std::string, Shape> expect;
  for (const auto& t : llama_model_tensors(cfg, DType::kF32)) expect[t.name] = t.shape;
  std::map<std::string, DType> dtype_of;
  for (const auto& rank : ranks)
    for (const auto& t : rank)
      for (const auto& sg : t.segments) {
        if (sg.tensor.empty() || dtype_of.count(sg.tensor)) continue;
        auto it = index.tensor_index.find(sg.tensor);
        if (it == index.tensor_index.end())
          return Status::NotFound("tensor '" + sg.tensor + "' (needed for " + t.name + ") is missing from '" +
                                  src.describe() + "'")
              .with_tensor(sg.tensor);
        const TensorMeta& m = src.tensors()[it->second];
        if (m.shape != expect[sg.tensor])
          return Status::Error("ShapeMismatch",
                               "tensor '" + sg.tensor + "' in '" + src.describe() + "' has shape " +
                                   shape_to_string(m.shape) + ", the config expects " +
                                   shape_to_string(expect[sg.tensor]))
              .with_tensor(sg.tensor);
        dtype_of[sg.tensor] = m.dtype;
      }

  std::error_code ec;
  if (fs::exists(dst, ec)) return Status::InvalidArgument("destination '" + dst + "' already exists");
  const std::string partial = dst + ".partial";
  fs::remove_all(partial, ec);  // a stale partial output of ours
  if (!fs::create_directories(partial, ec) || ec)
    return Status::Io("cannot create '" + partial + "': " + ec.message()).with_file(partial);
  auto fail = [&](Status s) {
    std::error_code e2;
    fs::remove_all(partial, e2);
    return s;
  };

  std::vector<unsigned char> buf;
  for (int p = 0; p < layout.pp; ++p) {
    for (int r = 0; r < layout.tp; ++r) {
      const auto& ts = ranks[static_cast<size_t>(p) * layout.tp + r];
      const std::string dir = partial + "/" + megatron_rank_dir(layout, r, p);
      if (!fs::create_directories(dir, ec) || ec) return fail(Status::Io("cannot create '" + dir + "': " + ec.message()));
      std::vector<TensorMeta> metas;
      std::vector<Piece> pieces;
      for (const auto& t : ts) {
        DType dt = DType::kF32;
        if (opts.dtype) {
          dt = *opts.dtype;
        } else {
          for (const auto& sg : t.segments)
            if (!sg.tensor.empty()) { dt = dtype_of[sg.tensor]; break; }
        }
        metas.push_back(TensorMeta{t.name, dt, t.shape});
        pieces.push_back(Piece{t.name, Region{Box::whole(t.shape)}, dt});
      }
      safetensors::WriterOptions wo;
      wo.rename_on_commit = false;
      const std::string file = dir + "/model.safetensors";
      safetensors::SafetensorsWriter w(file, wo);
      Status s = w.begin(metas, pieces, nlohmann::json::object());
      for (size_t i = 0; s.ok() && i < ts.size(); ++i)
        s = write_megatron_tensor(src, index, ts[i], metas[i].dtype, i, w, opts.chunk_bytes, buf);
      if (s.ok()) s = w.commit();
      if (!s.ok()) {
        w.abort();
        return fail(std::move(s).with_file(file));
      }
      if (Status d = safetensors::fsync_dir(dir); !d.ok()) return fail(std::move(d));
    }
  }
  nlohmann::json args = megatron_args(cfg, layout);
  if (Status s = safetensors::write_file_fsync(partial + "/megatron_args.json", args.dump(2) + "\n", true); !s.ok())
    return fail(std::move(s));
  if (Status s = safetensors::fsync_dir(partial); !s.ok()) return fail(std::move(s));
  fs::rename(partial, dst, ec);
  if (ec) return fail(Status::Io("cannot rename '" + partial + "' to '" + dst + "': " + ec.message()).with_file(dst));
  fs::path parent = fs::path(dst).parent_path();
  return safetensors::fsync_dir(parent.empty() ? "." : parent.string());
}

}  // namespace ckpt

// ---------------------------------------------------------------------------------------------
// Reading the layout back.

namespace ckpt {

namespace {

Status bad_args(const std::string& file, const std::string& msg) {
  return Status::Error("BadMegatronArgs", "'" + file + "': " + msg).with_file(file);
}

Result<int64_t> args_int(const nlohmann::json& j, const std::string& file, const char* key, int64_t lo, int64_t hi) {
  if (!j.contains(key) || !j.at(key).is_number_integer())
    return bad_args(file, std::string("key '") + key + "' must be an integer");
  const int64_t v = j.at(key).get<int64_t>();
  if (v < lo || v > hi)
    return bad_args(file, std::string("key '") + key + "' = " + std::to_string(v) + " outside " + std::to_string(lo) +
                              ".." + std::to_string(hi));
  return v;
}

class MegatronDirSource final : public TensorSource {
 public:
  struct Map {
    size_t file;       // index into files_
    size_t inner;      // piece index of the Megatron tensor in that file
    int64_t row_off;   // first row of the segment inside the Megatron tensor
  };

  const std::vector<TensorMeta>& tensors() const override { return tensors_; }
  const std::vector<Piece>& pieces() const override { return pieces_; }
  const nlohmann::json& metadata() const override { return meta_; }
  std::string describe() const override { return dir_; }

  Status read(size_t piece, const Box& sub, void* dst) override {
    if (piece >= pieces_.size()) return Status::Internal("Megatron piece " + std::to_string(piece) + " out of range");
    const Box& seg = pieces_[piece].region.box;
    if (!seg.contains(sub) || sub.ndim() != seg.ndim())
      return Status::Internal("read of " + sub.to_string() + " outside Megatron segment " + seg.to_string());
    const Map& m = map_[piece];
    Box inner = sub;
    for (size_t d = 0; d < sub.ndim(); ++d) inner.offset[d] = sub.offset[d] - seg.offset[d] + (d == 0 ? m.row_off : 0);
    return files_[m.file]->read(m.inner, inner, dst);
  }

  static Result<std::unique_ptr<TensorSource>> open(const std::string& dir_in) {
    auto src = std::unique_ptr<MegatronDirSource>(new MegatronDirSource());
    std::string dir = dir_in;
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    src->dir_ = dir;
    const std::string args_file = dir + "/megatron_args.json";
    CKPT_ASSIGN_OR_RETURN(nlohmann::json j, read_json_file(args_file, kMegatronArgsJsonLimits, "megatron_args.json"));
    if (!j.is_object()) return bad_args(args_file, "not a JSON object");
    constexpr int64_t kBig = int64_t{1} << 40;
    LlamaConfig c;
    CKPT_ASSIGN_OR_RETURN(const int64_t tp, args_int(j, args_file, "tensor_model_parallel_size", 1, 1 << 16));
    CKPT_ASSIGN_OR_RETURN(const int64_t pp, args_int(j, args_file, "pipeline_model_parallel_size", 1, 1 << 16));
    CKPT_ASSIGN_OR_RETURN(c.num_hidden_layers, args_int(j, args_file, "num_layers", 1, 1 << 20));
    CKPT_ASSIGN_OR_RETURN(c.hidden_size, args_int(j, args_file, "hidden_size", 1, kBig));
    CKPT_ASSIGN_OR_RETURN(c.intermediate_size, args_int(j, args_file, "ffn_hidden_size", 1, kBig));
    CKPT_ASSIGN_OR_RETURN(c.num_attention_heads, args_int(j, args_file, "num_attention_heads", 1, 1 << 20));
    CKPT_ASSIGN_OR_RETURN(c.num_key_value_heads, args_int(j, args_file, "num_query_groups", 1, 1 << 20));
    CKPT_ASSIGN_OR_RETURN(c.head_dim, args_int(j, args_file, "kv_channels", 1, 1 << 20));
    CKPT_ASSIGN_OR_RETURN(c.vocab_size, args_int(j, args_file, "vocab_size", 1, kBig));
    CKPT_ASSIGN_OR_RETURN(const int64_t divisor, args_int(j, args_file, "make_vocab_size_divisible_by", 1, 1 << 20));
    if (!j.contains("untie_embeddings_and_output_weights") || !j["untie_embeddings_and_output_weights"].is_boolean())
      return bad_args(args_file, "key 'untie_embeddings_and_output_weights' must be a boolean");
    c.tie_word_embeddings = !j["untie_embeddings_and_output_weights"].get<bool>();
    if (j.contains("swiglu") && j["swiglu"] != true) return Status::Unsupported("'" + args_file + "': swiglu is false");
    if (j.contains("norm_epsilon") && j["norm_epsilon"].is_number()) c.rms_norm_eps = j["norm_epsilon"].get<double>();
    if (j.contains("rotary_base") && j["rotary_base"].is_number()) c.rope_theta = j["rotary_base"].get<double>();
    if (j.contains("max_position_embeddings") && j["max_position_embeddings"].is_number_integer())
      c.max_position_embeddings = j["max_position_embeddings"].get<int64_t>();
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
    auto lay = Layout::make(static_cast<int>(tp), static_cast<int>(pp), 1, 0, static_cast<int>(c.num_hidden_layers), per);
    if (!lay.ok()) return lay.take_status().with_file(args_file);
    Layout layout = std::move(lay).value();
    layout.vocab_divisor = divisor;

    // Rank files; biases and norm naming are read off rank (0, 0)'s tensor names.
    const int ntp = layout.tp, npp = layout.pp;
    std::vector<std::string> names;
    for (int p = 0; p < npp; ++p)
      for (int r = 0; r < ntp; ++r) {
        const std::string f = dir + "/" + megatron_rank_dir(layout, r, p) + "/model.safetensors";
        auto sf = safetensors::SafetensorsFile::open(f);
        if (!sf.ok()) return sf.take_status().with_file(f).with_context("Megatron rank file");
        src->files_.push_back(std::move(sf).value());
        names.push_back(f);
      }
    auto has = [&](const std::string& n) {
      for (const auto& t : src->files_[0]->tensors())
        if (t.name == n) return true;
      return false;
    };
    c.attention_bias = has("decoder.layers.0.self_attention.linear_qkv.bias");
    c.mlp_bias = has("decoder.layers.0.mlp.linear_fc1.bias");
    const MegatronNormNames norms = has("decoder.layers.0.input_layernorm.weight") ? MegatronNormNames::kLocal
                                                                                    : MegatronNormNames::kTransformerEngine;
    // Validate the config the usual way (H divisible by K, even head_dim, ...).
    auto cv = LlamaConfig::from_json(c.to_json());
    if (!cv.ok()) return cv.take_status().with_file(args_file);
    c = std::move(cv).value();
    CKPT_RETURN_IF_ERROR(LlamaShardingRules(c).check_layout(layout));

    std::map<std::string, DType> dtype_of;
    for (int p = 0; p < npp; ++p)
      for (int r = 0; r < ntp; ++r) {
        const size_t fi = static_cast<size_t>(p) * ntp + r;
        const TensorSource& f = *src->files_[fi];
        std::map<std::string, size_t> in_file;
        for (size_t k = 0; k < f.tensors().size(); ++k) in_file[f.tensors()[k].name] = k;
        CKPT_ASSIGN_OR_RETURN(auto expected, megatron_rank_tensors(c, layout, r, p, norms));
        for (const MegatronTensor& t : expected) {
          auto it = in_file.find(t.name);
          if (it == in_file.end())
            return Status::Error("MissingTensor",
                                 "'" + names[fi] + "' has no tensor '" + t.name + "'")
                .with_file(names[fi]);
          const TensorMeta& got = f.tensors()[it->second];
          if (got.shape != t.shape)
            return Status::Error("ShapeMismatch", "'" + names[fi] + "': tensor '" + t.name + "' has shape " +
                                                           shape_to_string(got.shape) + ", the args imply " +
                                                           shape_to_string(t.shape))
                .with_file(names[fi]);
          // The file's piece of this tensor (one whole piece per tensor).
          size_t inner = f.pieces().size();
          for (size_t k = 0; k < f.pieces().size(); ++k)
            if (f.pieces()[k].tensor == t.name) inner = k;
          if (inner == f.pieces().size()) return Status::Internal("no piece for '" + t.name + "' in " + names[fi]);
          int64_t row = 0;
          for (const MegatronSegment& sg : t.segments) {
            if (!sg.tensor.empty()) {
              auto [dt, fresh] = dtype_of.emplace(sg.tensor, got.dtype);
              if (!fresh && dt->second != got.dtype)
                return Status::Error("DTypeMismatch", "'" + names[fi] + "': tensor '" + t.name + "' is " +
                                                               std::string(dtype_name(got.dtype)) + ", another rank holds '" +
                                                               sg.tensor + "' as " + std::string(dtype_name(dt->second)))
                    .with_file(names[fi]);
              src->pieces_.push_back({sg.tensor, Region{sg.box}, got.dtype});
              src->map_.push_back({fi, inner, row});
            }
            row += sg.rows();
          }
        }
      }
    for (TensorMeta t : llama_model_tensors(c, DType::kF32)) {
      auto it = dtype_of.find(t.name);
      if (it == dtype_of.end()) return Status::Internal("Megatron layout never holds '" + t.name + "'");
      t.dtype = it->second;
      src->tensors_.push_back(std::move(t));
    }
    if (!src->tensors_.empty()) c.dtype = src->tensors_.front().dtype;
    src->meta_ = {{"model_config", c.to_json()}, {"layout", layout.to_json()}, {"megatron_args", j}};
    return std::unique_ptr<TensorSource>(std::move(src));
  }

 private:
  MegatronDirSource() = default;
  std::string dir_;
  std::vector<std::unique_ptr<safetensors::SafetensorsFile>> files_;
  std::vector<TensorMeta> tensors_;
  std::vector<Piece> pieces_;
  std::vector<Map> map_;
  nlohmann::json meta_;
};

}  // namespace

bool is_megatron_dir(const std::string& dir) {
  std::error_code ec;
  return std::filesystem::is_directory(dir, ec) && std::filesystem::is_regular_file(dir + "/megatron_args.json", ec);
}

Result<std::unique_ptr<TensorSource>> open_megatron_dir(const std::string& dir) { return MegatronDirSource::open(dir); }

}  // namespace ckpt
