// CheckpointCore and RankView (checkpoint_core.h).
#include "formats/tensor/checked_reads.h"
#include "python/checkpoint_core.h"

#include <utility>

#include "converters/model/llama_config.h"
#include "converters/model/llama_sharding.h"
#include "converters/profile/profile_view.h"
#include "converters/profile/profile_view_job.h"
#include "converters/source/open_checkpoint.h"
#include "reshard/executor.h"
#include "reshard/planner.h"

namespace ckpt::py {

namespace {

struct PyDTypeName {
  DType dtype;
  const char* numpy;
};

constexpr PyDTypeName kPyDTypeNames[] = {
    {DType::kBool, "bool"},         {DType::kU8, "uint8"},     {DType::kI8, "int8"},
    {DType::kI16, "int16"},         {DType::kU16, "uint16"},   {DType::kI32, "int32"},
    {DType::kU32, "uint32"},        {DType::kI64, "int64"},    {DType::kU64, "uint64"},
    {DType::kF16, "float16"},       {DType::kBF16, "bfloat16"}, {DType::kF32, "float32"},
    {DType::kF64, "float64"},       {DType::kF8E4M3, "float8_e4m3fn"}, {DType::kF8E5M2, "float8_e5m2"},
    {DType::kF8E8M0, "float8_e8m0fnu"}, {DType::kF4, "float4_e2m1fn_x2"},  // F4: packed pairs (uint8 in numpy)
};

// Reads `region` of `tensor` (validated) from `src` into dst, box after box in storage order.
Status read_region_boxes(TensorSource& src, const SourceIndex& index, const std::string& tensor, const Region& region,
                         DType out, void* dst, const CastOptions& cast) {
  auto* p = static_cast<uint8_t*>(dst);
  const size_t os = dtype_size(out);
  for (const Box& b : region.boxes()) {
    CKPT_RETURN_IF_ERROR(read_global_box(src, index, tensor, b, out, p, cast));
    p += static_cast<size_t>(b.numel()) * os;
  }
  return Status::Ok();
}

// Checks `region` against tensor `t` and the caller's buffer size.
Status check_region(const TensorMeta& t, const Region& region, DType out, size_t dst_bytes) {
  Status st = validate_box(region.box, t.shape);
  if (!st.ok())
    return Status::InvalidArgument("box " + region.box.to_string() + " of tensor '" + t.name + "' (shape " +
                                   shape_to_string(t.shape) + "): " + st.message())
        .with_tensor(t.name);
  if (!flat_range_fits(region))
    return Status::InvalidArgument("flat range " + region.to_string() + " lies outside its box").with_tensor(t.name);
  const uint64_t want = static_cast<uint64_t>(region.numel()) * dtype_size(out);
  if (want != dst_bytes)
    return Status::Internal("read of '" + t.name + "' " + region.to_string() + ": buffer of " +
                            std::to_string(dst_bytes) + " bytes, need " + std::to_string(want))
        .with_tensor(t.name);
  return Status::Ok();
}

// The layout a state_dict asks for: the JSON object completed with what the checkpoint knows
// (its layer count for an even split, its layout's vocab_divisor and profile).
Result<Layout> complete_layout(nlohmann::json j, const LlamaConfig& cfg, const nlohmann::json& src_meta) {
  if (!j.is_object()) return Status::InvalidArgument("layout must be a dict, got " + std::string(j.type_name()));
  if (j.contains("pp_layers")) {
    j["layers_per_stage"] = j["pp_layers"];
    j.erase("pp_layers");
  }
  const bool general = j.contains("pipelines") || j.contains("hetero_process_meshes");
  if (!general && !j.contains("layers_per_stage") && !j.contains("stage_of_layer") && !j.contains("num_layers"))
    j["num_layers"] = cfg.num_hidden_layers;
  if (!general && !j.contains("pp")) j["pp"] = 1;
  if (!general && !j.contains("tp")) j["tp"] = 1;
  const nlohmann::json* src_layout = src_meta.contains("layout") ? &src_meta["layout"] : nullptr;
  if (src_layout && src_layout->is_object()) {
    for (const char* key : {"vocab_divisor", "profile"})
      if (!j.contains(key) && src_layout->contains(key)) j[key] = (*src_layout)[key];
  }
  auto l = Layout::from_json(j);
  if (!l.ok()) return l.take_status().with_context("layout " + j.dump());
  return l;
}

}  // namespace

const char* numpy_dtype_name(DType t) {
  for (const auto& e : kPyDTypeNames)
    if (e.dtype == t) return e.numpy;
  return "?";
}

Result<DType> dtype_from_any_name(const std::string& name) {
  for (const auto& e : kPyDTypeNames)
    if (name == e.numpy) return e.dtype;
  if (name == "float8_e4m3") return DType::kF8E4M3;
  auto d = dtype_from_name(name, /*cli_aliases=*/true);
  if (d.ok()) return d;
  return Status::InvalidArgument("unknown dtype '" + name + "' (numpy names like 'float32', 'bfloat16', "
                                 "'float8_e4m3fn', or ckpt's like 'F32', 'BF16', 'bf16')");
}

Result<std::shared_ptr<CheckpointCore>> CheckpointCore::open(const std::string& path) {
  std::shared_ptr<CheckpointCore> c(new CheckpointCore());
  c->path_ = path;
  const CheckpointKind* k = detect_checkpoint(path);
  c->kind_ = k ? k->name : "unknown";
  // Every piece checked by its format's own checks before its first read (formats/tensor/checked_reads.h).
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<TensorSource> opened, open_checkpoint(path));
  c->src_ = std::make_unique<CheckedReads>(std::move(opened));
  CKPT_ASSIGN_OR_RETURN(c->index_, SourceIndex::build(*c->src_));
  c->tensors_ = c->src_->tensors();
  c->metadata_ = c->src_->metadata();
  return c;
}

CheckpointCore::~CheckpointCore() = default;

const TensorMeta* CheckpointCore::find(const std::string& name) const {
  auto it = index_.tensor_index.find(name);
  return it == index_.tensor_index.end() ? nullptr : &tensors_[it->second];
}

Status CheckpointCore::check_open_locked() const {
  if (!src_) return Status::InvalidArgument("checkpoint '" + path_ + "' is closed").with_file(path_);
  return Status::Ok();
}

Status CheckpointCore::read(const std::string& name, const Region& region, DType out, void* dst, size_t dst_bytes,
                            const CastOptions& cast) {
  std::lock_guard<std::mutex> lock(mu_);
  CKPT_RETURN_IF_ERROR(check_open_locked());
  const TensorMeta* t = find(name);
  if (!t) return Status::NotFound("checkpoint '" + path_ + "' has no tensor '" + name + "'").with_tensor(name);
  CKPT_RETURN_IF_ERROR(check_region(*t, region, out, dst_bytes));
  if (region.numel() == 0) return Status::Ok();
  return read_region_boxes(*src_, index_, name, region, out, dst, cast);
}

void CheckpointCore::close() {
  std::lock_guard<std::mutex> lock(mu_);
  src_.reset();
}

bool CheckpointCore::closed() {
  std::lock_guard<std::mutex> lock(mu_);
  return !src_;
}

Result<std::unique_ptr<RankView>> RankView::make(std::shared_ptr<CheckpointCore> core, const nlohmann::json& layout,
                                                 int rank, const std::string& profile) {
  std::lock_guard<std::mutex> lock(core->mu_);
  CKPT_RETURN_IF_ERROR(core->check_open_locked());
  const nlohmann::json& md = core->metadata_;
  if (!md.is_object() || !md.contains("model_config"))
    return Status::Error("NoModelConfig", "checkpoint '" + core->path_ +
                                              "' has no model_config metadata: cannot derive the sharding rules")
        .with_file(core->path_);
  auto cfg = LlamaConfig::from_json(md["model_config"]);
  if (!cfg.ok()) return cfg.take_status().with_context("model_config of '" + core->path_ + "'");
  std::unique_ptr<RankView> v(new RankView());
  CKPT_ASSIGN_OR_RETURN(v->layout_, complete_layout(layout, *cfg, md));
  ProfileRequest req;
  req.profile = profile;
  const ShardingRules* rules = nullptr;
  if (needs_profile_views(md, req)) {
    CKPT_ASSIGN_OR_RETURN(v->conv_, ProfileConversion::prepare(*core->src_, req, *cfg, v->layout_, true, kProfileTileBytes));
    CKPT_ASSIGN_OR_RETURN(v->view_index_, SourceIndex::build(v->conv_->source()));
    v->tensors_ = v->conv_->source().tensors();
    rules = &v->conv_->rules();
  } else {
    v->rules_ = std::make_unique<LlamaShardingRules>(*cfg);
    v->tensors_ = core->tensors_;
    rules = v->rules_.get();
  }
  auto pieces = rank_view(v->tensors_, v->layout_, *rules, rank);
  if (!pieces.ok()) return pieces.take_status().with_context("state_dict of '" + core->path_ + "' under " + v->layout_.to_string());
  v->pieces_ = std::move(pieces).value();
  v->core_ = std::move(core);
  return v;
}

RankView::~RankView() = default;

Status RankView::read(size_t i, DType out, void* dst, size_t dst_bytes, const CastOptions& cast) {
  std::lock_guard<std::mutex> lock(core_->mu_);
  CKPT_RETURN_IF_ERROR(core_->check_open_locked());
  if (i >= pieces_.size()) return Status::Internal("rank view piece " + std::to_string(i) + " out of range");
  const Piece& p = pieces_[i];
  const TensorMeta* t = nullptr;
  for (const TensorMeta& m : tensors_)
    if (m.name == p.tensor) t = &m;
  if (!t) return Status::Internal("rank view piece of unknown tensor '" + p.tensor + "'");
  CKPT_RETURN_IF_ERROR(check_region(*t, p.region, out, dst_bytes));
  if (conv_) return read_region_boxes(conv_->source(), view_index_, p.tensor, p.region, out, dst, cast);
  return read_region_boxes(*core_->src_, core_->index_, p.tensor, p.region, out, dst, cast);
}

}  // namespace ckpt::py
