#include "converters/megatron_layout.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <system_error>

#include "converters/llama_sharding.h"
#include "formats/safetensors/st_writer.h"
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

Status refuse(ErrorKind kind, const std::string& msg) { return Status::Error(kind, "LayoutRefused", msg); }

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
          return Status::Error(ErrorKind::kCorruption, "ShapeMismatch",
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
