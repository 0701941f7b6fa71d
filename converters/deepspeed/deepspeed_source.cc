#include "converters/deepspeed/deepspeed_source.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <system_error>
#include <utility>
#include <vector>

#include "converters/deepspeed/deepspeed_files.h"
#include "converters/deepspeed/ds_partitions.h"
#include "converters/megatron/megatron_torch_optim.h"
#include "formats/base/json_read.h"
#include "formats/torch/torch_file.h"

namespace ckpt {

namespace deepspeed_detail {

namespace fs = std::filesystem;
using torch::PyObj;
using torch::PyType;

class DeepSpeedSource final : public TensorSource {
 public:
  const std::vector<TensorMeta>& tensors() const override { return tensors_; }
  const std::vector<Piece>& pieces() const override { return pieces_; }
  const nlohmann::json& metadata() const override { return meta_; }
  std::string describe() const override { return dir_; }

  Status read(size_t piece, const Box& sub, void* dst) override {
    if (piece >= src_.size()) return Status::Internal("DeepSpeed piece out of range");
    const Src& s = src_[piece];
    const DsParamLayout& l = layouts_[s.param];
    const uint64_t es = dtype_size(pieces_[piece].dtype);
    auto* out = static_cast<char*>(dst);
    std::lock_guard<std::mutex> g(mu_);
    return ds_for_each_flat_run(l.shape, sub, [&](int64_t flat, int64_t at, int64_t count) -> Status {
      auto it = std::upper_bound(l.segments.begin(), l.segments.end(), flat,
                                 [](int64_t f, const DsSegment& z) { return f < z.param_begin; });
      if (it == l.segments.begin()) return Status::Internal("DeepSpeed segment lookup");
      --it;
      while (count > 0) {
        if (it == l.segments.end() || flat < it->param_begin || flat >= it->param_begin + it->numel)
          return Status::Internal("DeepSpeed segments do not tile '" + l.name + "'");
        const int64_t take = std::min(count, it->param_begin + it->numel - flat);
        const torch::TensorRef* ref = (*s.refs)[it->rank][it->group];
        const uint64_t elem = static_cast<uint64_t>(ref->storage_offset + it->offset + (flat - it->param_begin));
        Status st = ranks_[it->rank].file->read_storage(ref->storage.key, elem * es, static_cast<uint64_t>(take) * es, out + at * es);
        if (!st.ok()) return std::move(st).with_tensor(pieces_[piece].tensor);
        flat += take, at += take, count -= take;
        ++it;
      }
      return Status::Ok();
    });
  }

  // The zip entries holding piece `piece`'s runs (its segments' rank storages), CRC-checked once
  // each (the outcome is kept).
  Status check_piece(size_t piece) override {
    if (piece >= src_.size()) return Status::InvalidArgument("piece index " + std::to_string(piece) + " out of range");
    const Src& s = src_[piece];
    std::lock_guard<std::mutex> g(mu_);
    for (const DsSegment& seg : layouts_[s.param].segments) {
      Status st = checks_.check(*ranks_[seg.rank].file, (*s.refs)[seg.rank][seg.group]->storage.key);
      if (!st.ok()) return std::move(st).with_tensor(pieces_[piece].tensor);
    }
    return Status::Ok();
  }

  IntegrityInfo integrity() const override {
    return {"DeepSpeed ZeRO torch files", "zip CRC-32",
            "DeepSpeed ZeRO torch files: `latest` and the file set have no checksum; CRC-32 finds damaged bytes, not deliberate edits"};
  }
  CheckReport check(const CheckOptions& o) override {
    std::vector<torch::ZipCheckFile> files;
    for (torch::TorchFile* f : all_files()) files.push_back({f, "", {}});
    std::lock_guard<std::mutex> g(mu_);
    return torch::check_zip_files(files, o);
  }

  static Result<std::unique_ptr<TensorSource>> open(const std::string& path_in) {
    std::string path = path_in;
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    auto s = std::unique_ptr<DeepSpeedSource>(new DeepSpeedSource());
    std::string tag;
    CKPT_ASSIGN_OR_RETURN(s->dir_, step_dir_of(path, &tag));
    CKPT_ASSIGN_OR_RETURN(RankFiles rf, rank_files(s->dir_));
    for (const std::string& f : rf.optim) {
      CKPT_ASSIGN_OR_RETURN(RankOptim r, read_rank_optim(f));
      s->ranks_.push_back(std::move(r));
    }
    const RankOptim& r0 = s->ranks_.front();
    const int world = static_cast<int>(s->ranks_.size());
    for (const RankOptim& r : s->ranks_) {
      if (r.stage != r0.stage)
        return Status::Error("DeepSpeedStage", "'" + r.path + "' is ZeRO stage " + std::to_string(r.stage) + ", '" + r0.path + "' stage " +
                                                   std::to_string(r0.stage)).with_file(r.path);
      if (r.partition_count != world)
        return Status::Error("DeepSpeedPartitionCount", "'" + r.path + "': partition_count is " + std::to_string(r.partition_count) +
                                                            " but the directory holds " + std::to_string(world) +
                                                            " optimizer rank files (an overwritten or incomplete save?)").with_file(r.path);
      if (r.no_state != r0.no_state || r.exp_avg.size() != r0.exp_avg.size())
        return Status::Error("DeepSpeedOptimizerState", "'" + r.path + "' and '" + r0.path + "' disagree on whether they hold Adam state")
            .with_file(r.path);
    }
    const int stage = r0.stage;
    // The parameters' names and shapes.
    const std::string model_file = s->dir_ + "/" + (stage <= 2 ? kModelStates12 : kModelStates3);
    std::error_code ec;
    if (!fs::is_regular_file(model_file, ec))
      return Status::Error("DeepSpeedMissingRank", "'" + model_file + "' is missing (ZeRO stage " + std::to_string(stage) + "'s model states)")
          .with_file(model_file);
    CKPT_ASSIGN_OR_RETURN(s->model_, torch::TorchFile::open(model_file));
    CKPT_ASSIGN_OR_RETURN(auto shapes, param_shapes(s->model_->root(), model_file));
    // Sizes of every rank's partitions, then the layout.
    std::vector<std::vector<int64_t>> numel;
    for (const RankOptim& r : s->ranks_) {
      std::vector<int64_t> v;
      for (const torch::TensorRef* t : r.fp32) v.push_back(t->size[0]);
      numel.push_back(std::move(v));
      if (r.fp32.size() != r0.fp32.size() || (stage <= 2 && r.fp32.size() != shapes.size()))
        return Status::Error("DeepSpeedPartitionCount", "'" + r.path + "' holds " + std::to_string(r.fp32.size()) + " fp32 partitions, " +
                                                            (stage <= 2 ? "param_shapes lists " + std::to_string(shapes.size()) + " param groups"
                                                                        : "rank 0 " + std::to_string(r0.fp32.size())))
            .with_file(r.path);
      for (size_t g = 0; g < r.fp32.size(); ++g)
        if (r.fp32[g]->storage.dtype != r0.fp32[g]->storage.dtype)
          return not_zero(r.path, "fp32 partition " + std::to_string(g) + " is " + dt(r.fp32[g]->storage.dtype) + ", rank 0's " +
                                      dt(r0.fp32[g]->storage.dtype));
    }
    int failed_rank = -1;
    Result<std::vector<DsParamLayout>> layouts = [&]() -> Result<std::vector<DsParamLayout>> {
      std::vector<std::vector<int64_t>> pads;
      for (const RankOptim& r : s->ranks_) pads.push_back(r.group_paddings);
      if (stage <= 2) return ds_zero12_layout(shapes, numel, pads, r0.alignment_paddings, &failed_rank);
      std::vector<DsParamShape> all;
      for (const auto& g : shapes) all.insert(all.end(), g.begin(), g.end());
      return ds_zero3_layout(all, numel, &failed_rank);
    }();
    if (!layouts.ok()) {
      const std::string& f = failed_rank >= 0 && failed_rank < world ? s->ranks_[failed_rank].path : model_file;
      return layouts.take_status().with_file(f).with_context("'" + f + "'");
    }
    s->layouts_ = std::move(*layouts);
    CKPT_ASSIGN_OR_RETURN(const std::optional<double> step, moments_and_step(s->ranks_));
    s->add_tensors(!r0.exp_avg.empty());
    CKPT_RETURN_IF_ERROR(s->add_metadata(path, rf, tag, step));
    return std::unique_ptr<TensorSource>(std::move(s));
  }

  // The moments: of their partition's size (stages 1/2 keep the padding at the end of the moments);
  // the step: one for every group of every rank (none without Adam state).
  static Result<std::optional<double>> moments_and_step(const std::vector<RankOptim>& ranks) {
    for (const RankOptim& r : ranks)
      for (size_t g = 0; g < r.exp_avg.size(); ++g)
        for (const torch::TensorRef* m : {r.exp_avg[g], r.exp_avg_sq[g]}) {
          const int64_t part = r.fp32[g]->size[0], pad = g < r.group_paddings.size() ? r.group_paddings[g] : 0;
          if (m->size[0] != part && m->size[0] - part != pad)
            return Status::Error("DeepSpeedOptimizerState", "'" + r.path + "': the Adam moment " + (m == r.exp_avg[g] ? "exp_avg" : "exp_avg_sq") +
                                                                " of param group " + std::to_string(g) + " holds " + std::to_string(m->size[0]) +
                                                                " elements, the fp32 partition " + std::to_string(part) +
                                                                (pad ? " (+ " + std::to_string(pad) + " padding)" : std::string()))
                .with_file(r.path);
        }
    std::optional<double> step;
    for (const RankOptim& r : ranks)
      for (double v : r.steps) {
        if (step && *step != v)
          return Status::Error("DeepSpeedStepMismatch", "'" + r.path + "': Adam step " + std::to_string(v) + ", elsewhere " + std::to_string(*step))
              .with_file(r.path);
        step = v;
      }
    return step;
  }

  // The metadata: the run (stage, world, tag, dtype, DeepSpeed's version and steps, the step), the
  // "detected" line, Adam's hyper-parameters, and config.json where the HF Trainer puts it (beside
  // `latest`, in the step dir or its parent).
  Status add_metadata(const std::string& path, const RankFiles& rf, const std::string& tag, std::optional<double> step) {
    const RankOptim& r0 = ranks_.front();
    const int stage = r0.stage, world = static_cast<int>(ranks_.size());
    std::error_code ec;
    nlohmann::json ds = {{"stage", stage}, {"world", world}, {"tag", tag}, {"step_dir", dir_}, {"dtype", rf.prefix == "bf16_" ? "bf16" : "fp32"}};
    const PyObj* mroot = model_->root();
    if (const PyObj* v = mroot->get("ds_version"); v != nullptr && v->is(PyType::kStr) && v->s.size() < 64) ds["ds_version"] = v->s;
    if (const PyObj* v = mroot->get("global_steps"); v != nullptr && v->is(PyType::kInt)) ds["global_steps"] = v->i;
    if (step) ds["optimizer_step"] = static_cast<int64_t>(*step);
    if (!r0.no_state.empty()) ds["optimizer_not_imported"] = r0.no_state;
    if (rf.prefix != "bf16_") {  // fp16 or fp32: the module's dtype says which
      if (const PyObj* m = mroot->get("module");
          m != nullptr && m->is(PyType::kDict) && !m->entries.empty() && m->entries[0].second->is(PyType::kTensor))
        ds["dtype"] = train_dtype(m->entries[0].second->tensor.storage.dtype);
    }
    ds["detected"] = "DeepSpeed ZeRO stage " + std::to_string(stage) + " checkpoint, " + std::to_string(world) + " data-parallel ranks, " +
                     ds["dtype"].get<std::string>() + " training, tag '" + tag + "', " + std::to_string(layouts_.size()) + " parameters" +
                     (r0.exp_avg.empty() ? " (no Adam state)" : " with Adam state");
    meta_["deepspeed"] = ds;
    nlohmann::json adam = torch_adam_hyper(r0.param_groups);
    if (!adam.empty()) meta_["adam"] = adam;
    CKPT_RETURN_IF_ERROR(read_config_beside({path, dir_, fs::path(path).parent_path().string()}, meta_));
    return Status::Ok();
  }

 private:
  DeepSpeedSource() = default;

  struct Src {
    size_t param = 0;
    const std::vector<std::vector<const torch::TensorRef*>>* refs = nullptr;  // [rank][group]
  };

  void add_tensors(bool adam) {
    masters_.resize(ranks_.size()), exp_avg_.resize(ranks_.size()), exp_avg_sq_.resize(ranks_.size());
    for (size_t r = 0; r < ranks_.size(); ++r)
      masters_[r] = ranks_[r].fp32, exp_avg_[r] = ranks_[r].exp_avg, exp_avg_sq_[r] = ranks_[r].exp_avg_sq;
    auto add = [&](const std::string& name, size_t p, const std::vector<std::vector<const torch::TensorRef*>>& refs) {
      const DsParamLayout& l = layouts_[p];
      const DType d = l.segments.empty() ? DType::kF32 : refs[l.segments[0].rank][l.segments[0].group]->storage.dtype;
      tensors_.push_back({name, d, l.shape});
      pieces_.push_back({name, Region{Box::whole(l.shape)}, d});
      src_.push_back({p, &refs});
    };
    for (size_t p = 0; p < layouts_.size(); ++p) add(layouts_[p].name, p, masters_);
    if (!adam) return;
    for (size_t p = 0; p < layouts_.size(); ++p) add(kMegatronOptimPrefixes[0] + layouts_[p].name, p, exp_avg_);
    for (size_t p = 0; p < layouts_.size(); ++p) add(kMegatronOptimPrefixes[1] + layouts_[p].name, p, exp_avg_sq_);
  }

  std::vector<torch::TorchFile*> all_files() {
    std::vector<torch::TorchFile*> v{model_.get()};
    for (RankOptim& r : ranks_) v.push_back(r.file.get());
    return v;
  }

  std::string dir_;
  std::unique_ptr<torch::TorchFile> model_;
  std::vector<RankOptim> ranks_;
  std::vector<DsParamLayout> layouts_;
  std::vector<std::vector<const torch::TensorRef*>> masters_, exp_avg_, exp_avg_sq_;  // [rank][group]
  std::vector<TensorMeta> tensors_;
  std::vector<Piece> pieces_;
  std::vector<Src> src_;
  std::mutex mu_;  // reads and checks: one thread at a time through the libzip handles
  torch::StorageChecks checks_;
  nlohmann::json meta_ = nlohmann::json::object();
};

}  // namespace deepspeed_detail

bool is_deepspeed_dir(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return false;
  if (deepspeed_detail::is_step_dir(path)) return true;
  if (!fs::is_regular_file(fs::path(path) / "latest", ec)) return false;
  size_t n = 0;
  for (fs::directory_iterator it(path, ec), end; !ec && it != end && n < 4096; it.increment(ec), ++n)
    if (it->is_directory(ec) && deepspeed_detail::is_step_dir(it->path())) return true;
  return false;
}

Result<std::unique_ptr<TensorSource>> open_deepspeed_dir(const std::string& path) {
  return deepspeed_detail::DeepSpeedSource::open(path);
}

}  // namespace ckpt
