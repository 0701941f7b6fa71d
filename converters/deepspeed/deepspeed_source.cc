#include "converters/deepspeed/deepspeed_source.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <regex>
#include <system_error>
#include <utility>
#include <vector>

#include "converters/deepspeed/ds_partitions.h"
#include "converters/megatron/megatron_torch_optim.h"
#include "formats/base/json_read.h"
#include "formats/torch/torch_file.h"

namespace ckpt {

namespace deepspeed_detail {

namespace fs = std::filesystem;
using torch::PyObj;
using torch::PyType;

constexpr size_t kMaxDirEntries = 1 << 16;  // entries of a step directory looked at
constexpr size_t kMaxRanks = 1 << 14;

const char* const kModelStates12 = "mp_rank_00_model_states.pt";
const char* const kModelStates3 = "zero_pp_rank_0_mp_rank_00_model_states.pt";

Status not_zero(const std::string& file, const std::string& msg) {
  return Status::Error("DeepSpeedNotZero", "'" + file + "': " + msg).with_file(file);
}

std::string dt(DType d) { return std::string(dtype_name(d)); }

// The training dtype as DeepSpeed's config names it.
std::string train_dtype(DType d) { return d == DType::kBF16 ? "bf16" : d == DType::kF16 ? "fp16" : d == DType::kF32 ? "fp32" : dt(d); }

std::string kind_of(const PyObj* v) { return v == nullptr ? "nothing" : v->is(PyType::kRecord) ? v->cls : py_type_name(v->type); }

bool is_step_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p / kModelStates12, ec) || fs::is_regular_file(p / kModelStates3, ec);
}

// The ZeroStageEnum's value: ZeroStageEnum(2) (by value) or getattr(ZeroStageEnum, 'gradients').
int zero_stage_of(const PyObj* v) {
  if (v == nullptr) return -1;
  if (v->is(PyType::kInt)) return static_cast<int>(v->i);
  if (!v->is_record("deepspeed.runtime.zero.config.ZeroStageEnum") || v->args == nullptr || v->args->items.size() != 1) return -1;
  const PyObj* a = v->args->items[0];
  if (a->is(PyType::kInt)) return a->i >= 0 && a->i <= 3 ? static_cast<int>(a->i) : -1;
  static const std::pair<const char*, int> kNames[] = {{"disabled", 0}, {"optimizer_states", 1}, {"gradients", 2}, {"weights", 3}};
  if (a->is(PyType::kStr))
    for (const auto& [n, s] : kNames)
      if (a->s == n) return s;
  return -1;
}

// A flat fp32 (or other float) partition: a 1-D contiguous tensor.
Result<const torch::TensorRef*> flat_tensor(const PyObj* v, const std::string& file, const std::string& what) {
  if (v == nullptr || !v->is(PyType::kTensor)) return not_zero(file, what + " is " + kind_of(v) + ", expected a 1-D tensor");
  const torch::TensorRef& t = v->tensor;
  if (t.size.size() != 1 || t.stride.size() != 1 || (t.size[0] > 1 && t.stride[0] != 1))
    return not_zero(file, what + " is a tensor of shape " + shape_to_string(Shape(t.size.begin(), t.size.end())) +
                              ", expected a contiguous 1-D partition");
  const DType d = t.storage.dtype;
  if (d != DType::kF32 && d != DType::kBF16 && d != DType::kF16 && d != DType::kF64)
    return not_zero(file, what + " holds " + dt(d) + ", expected floating-point values");
  return &t;
}

Result<std::vector<const PyObj*>> list_of(const PyObj* v, const std::string& file, const std::string& what) {
  if (v == nullptr || !(v->is(PyType::kList) || v->is(PyType::kTuple)))
    return not_zero(file, what + " is " + kind_of(v) + ", expected a list");
  return v->items;
}

Result<int64_t> int_of(const PyObj* v, const std::string& file, const std::string& what) {
  if (v == nullptr || !v->is(PyType::kInt)) return not_zero(file, what + " is " + kind_of(v) + ", expected an int");
  return v->i;
}

// One rank's optimizer file, parsed.
struct RankOptim {
  std::string path;
  std::unique_ptr<torch::TorchFile> file;
  int stage = -1;
  int64_t partition_count = 0;               // max over groups
  std::vector<const torch::TensorRef*> fp32;  // per group
  std::vector<const torch::TensorRef*> exp_avg, exp_avg_sq;  // per group (empty: no Adam state)
  std::vector<double> steps;                  // per group
  std::vector<int64_t> group_paddings;        // stages 1/2
  std::vector<std::vector<int64_t>> alignment_paddings;
  const PyObj* param_groups = nullptr;
  std::string no_state;  // why the Adam state is not there ("" when it is)
};

// The step of a torch Adam state: an int (FusedAdam), a float, or a 0-d tensor (torch AdamW).
Result<double> step_of(const PyObj* v, torch::TorchFile& f, const std::string& what) {
  if (v == nullptr) return not_zero(f.path(), what + " has no 'step'");
  if (v->is(PyType::kInt)) return static_cast<double>(v->i);
  if (v->is(PyType::kFloat)) return v->f;
  if (v->is(PyType::kTensor) && v->tensor.size.empty()) {
    const DType d = v->tensor.storage.dtype;
    unsigned char b[8] = {};
    if (d == DType::kF32 || d == DType::kF64 || d == DType::kI64 || d == DType::kI32) {
      CKPT_RETURN_IF_ERROR(f.read_tensor(v->tensor, Box::whole({}), b));
      if (d == DType::kF32) { float x; std::memcpy(&x, b, 4); return static_cast<double>(x); }
      if (d == DType::kF64) { double x; std::memcpy(&x, b, 8); return x; }
      if (d == DType::kI64) { int64_t x; std::memcpy(&x, b, 8); return static_cast<double>(x); }
      int32_t x; std::memcpy(&x, b, 4); return static_cast<double>(x);
    }
  }
  return not_zero(f.path(), what + " 'step' is " + kind_of(v) + ", expected a number or a 0-d tensor");
}

// The Adam state of group g: state[param_groups[g]['params'][0]].
Status read_adam(RankOptim& r, const PyObj* opt, const std::string& key) {
  const std::string& file = r.path;
  if (opt == nullptr || !opt->is(PyType::kDict)) {
    r.no_state = "'" + key + "' is " + kind_of(opt);
    return Status::Ok();
  }
  const PyObj* state = opt->get("state");
  r.param_groups = opt->get("param_groups");
  CKPT_ASSIGN_OR_RETURN(auto groups, list_of(r.param_groups, file, key + "['param_groups']"));
  if (state == nullptr || !state->is(PyType::kDict) || state->entries.empty()) {
    r.no_state = "'" + key + "' holds no 'state' (the optimizer has not stepped)";
    return Status::Ok();
  }
  if (groups.size() != r.fp32.size())
    return Status::Error("DeepSpeedOptimizerState", "'" + file + "': " + key + " has " + std::to_string(groups.size()) +
                                                        " param groups, the file " + std::to_string(r.fp32.size()) + " fp32 partitions")
        .with_file(file);
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string where = key + "['param_groups'][" + std::to_string(g) + "]";
    if (!groups[g]->is(PyType::kDict)) return not_zero(file, where + " is " + kind_of(groups[g]));
    CKPT_ASSIGN_OR_RETURN(auto ids, list_of(groups[g]->get("params"), file, where + "['params']"));
    if (ids.size() != 1)
      return Status::Error("DeepSpeedOptimizerState", "'" + file + "': " + where + " lists " + std::to_string(ids.size()) +
                                                          " parameters, ZeRO's flat group is one").with_file(file);
    const PyObj* st = nullptr;
    for (const auto& [k, v] : state->entries)
      if (k->is(PyType::kInt) && ids[0]->is(PyType::kInt) && k->i == ids[0]->i) st = v;
    const std::string sw = key + "['state'][" + (ids[0]->is(PyType::kInt) ? std::to_string(ids[0]->i) : "?") + "]";
    if (st == nullptr || !st->is(PyType::kDict))
      return Status::Error("DeepSpeedOptimizerState", "'" + file + "': " + sw + " is missing (param group " + std::to_string(g) + ")").with_file(file);
    for (const char* m : {"exp_avg", "exp_avg_sq"}) {
      const PyObj* t = st->get(m);
      if (t == nullptr)
        return Status::Error("DeepSpeedOptimizerState", "'" + file + "': " + sw + " has no '" + m + "'").with_file(file);
      CKPT_ASSIGN_OR_RETURN(const torch::TensorRef* ref, flat_tensor(t, file, sw + "['" + m + "']"));
      (std::string(m) == "exp_avg" ? r.exp_avg : r.exp_avg_sq).push_back(ref);
    }
    // torch's Adam/AdamW keep the step per parameter; DeepSpeed's FusedAdam in the param group.
    const PyObj* step = st->get("step") != nullptr ? st->get("step") : groups[g]->get("step");
    CKPT_ASSIGN_OR_RETURN(double s, step_of(step, *r.file, sw));
    r.steps.push_back(s);
  }
  return Status::Ok();
}

Result<RankOptim> read_rank_optim(const std::string& path) {
  RankOptim r;
  r.path = path;
  CKPT_ASSIGN_OR_RETURN(r.file, torch::TorchFile::open(path));
  const PyObj* root = r.file->root();
  if (!root->is(PyType::kDict)) return not_zero(path, "holds a " + kind_of(root) + ", not DeepSpeed's checkpoint dict");
  const PyObj* osd = root->get("optimizer_state_dict");
  if (osd == nullptr || !osd->is(PyType::kDict)) return not_zero(path, "'optimizer_state_dict' is " + kind_of(osd) + ", expected a dict");
  r.stage = zero_stage_of(osd->get("zero_stage"));
  if (r.stage < 1 || r.stage > 3)
    return Status::Error("DeepSpeedStage", "'" + path + "': zero_stage is " + kind_of(osd->get("zero_stage")) +
                                               ", expected ZeroStageEnum 1, 2 or 3").with_file(path);
  const PyObj* pc = osd->get("partition_count");
  if (pc != nullptr && (pc->is(PyType::kList) || pc->is(PyType::kTuple))) {
    for (const PyObj* x : pc->items) {
      CKPT_ASSIGN_OR_RETURN(int64_t n, int_of(x, path, "partition_count[]"));
      r.partition_count = std::max(r.partition_count, n);
    }
  } else {
    CKPT_ASSIGN_OR_RETURN(r.partition_count, int_of(pc, path, "partition_count"));
  }
  const char* groups_key = r.stage <= 2 ? "single_partition_of_fp32_groups" : "fp32_flat_groups";
  CKPT_ASSIGN_OR_RETURN(auto groups, list_of(osd->get(groups_key), path, std::string("'") + groups_key + "'"));
  for (size_t g = 0; g < groups.size(); ++g) {
    CKPT_ASSIGN_OR_RETURN(const torch::TensorRef* t, flat_tensor(groups[g], path, std::string(groups_key) + "[" + std::to_string(g) + "]"));
    r.fp32.push_back(t);
  }
  if (r.stage <= 2) {
    CKPT_ASSIGN_OR_RETURN(auto pads, list_of(osd->get("group_paddings"), path, "'group_paddings'"));
    for (const PyObj* p : pads) {
      CKPT_ASSIGN_OR_RETURN(int64_t n, int_of(p, path, "group_paddings[]"));
      r.group_paddings.push_back(n);
    }
    if (const PyObj* ap = osd->get("param_alignment_paddings"); ap != nullptr && !ap->is(PyType::kNone)) {
      CKPT_ASSIGN_OR_RETURN(auto gl, list_of(ap, path, "'param_alignment_paddings'"));
      for (const PyObj* g : gl) {
        CKPT_ASSIGN_OR_RETURN(auto pl, list_of(g, path, "param_alignment_paddings[]"));
        std::vector<int64_t> v;
        for (const PyObj* p : pl) {
          CKPT_ASSIGN_OR_RETURN(int64_t n, int_of(p, path, "param_alignment_paddings[][]"));
          v.push_back(n);
        }
        r.alignment_paddings.push_back(std::move(v));
      }
    }
  }
  const char* adam_key = r.stage <= 2 ? "base_optimizer_state" : "optimizer_state_dict";
  CKPT_RETURN_IF_ERROR(read_adam(r, osd->get(adam_key), adam_key));
  return r;
}

// param_shapes of a model states file: [OrderedDict(name -> torch.Size)] per group.
Result<std::vector<std::vector<DsParamShape>>> param_shapes(const PyObj* root, const std::string& file) {
  if (!root->is(PyType::kDict)) return not_zero(file, "holds a " + kind_of(root) + ", not DeepSpeed's model states dict");
  for (const char* k : {"frozen_param_shapes", "shared_params"})
    if (const PyObj* v = root->get(k); v != nullptr && v->is(PyType::kDict) && !v->entries.empty())
      return Status::Unsupported("'" + file + "' has " + k + " (" + std::to_string(v->entries.size()) +
                                 " entries): frozen and shared (tied) parameters of DeepSpeed checkpoints are not read yet")
          .with_file(file);
  CKPT_ASSIGN_OR_RETURN(auto groups, list_of(root->get("param_shapes"), file, "'param_shapes'"));
  std::vector<std::vector<DsParamShape>> out;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!groups[g]->is(PyType::kDict)) return not_zero(file, "param_shapes[" + std::to_string(g) + "] is " + kind_of(groups[g]));
    std::vector<DsParamShape> ps;
    for (const auto& [k, v] : groups[g]->entries) {
      if (!k->is(PyType::kStr) || k->s.empty() || k->s.size() > 1024)
        return not_zero(file, "param_shapes[" + std::to_string(g) + "] has a key that is no parameter name");
      CKPT_ASSIGN_OR_RETURN(auto dims, list_of(v, file, "param_shapes['" + k->s + "']"));
      Shape s;
      for (const PyObj* d : dims) {
        CKPT_ASSIGN_OR_RETURN(int64_t n, int_of(d, file, "param_shapes['" + k->s + "'][]"));
        s.push_back(n);
      }
      if (s.size() > 8) return not_zero(file, "param_shapes['" + k->s + "'] has " + std::to_string(s.size()) + " dimensions");
      ps.push_back({k->s, std::move(s)});
    }
    out.push_back(std::move(ps));
  }
  return out;
}

// The step directory of `path`: `path` itself, or the tag `latest` names.
Result<std::string> step_dir_of(const std::string& path, std::string* tag) {
  if (is_step_dir(path)) {
    *tag = fs::path(path).filename().string();
    return path;
  }
  const std::string latest = path + "/latest";
  std::ifstream in(latest);
  std::string text(256, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\r')) text.pop_back();
  if (text.empty() || text.size() > 200 || text.find('/') != std::string::npos || text == "." || text == "..")
    return Status::Error("DeepSpeedLatest", "'" + latest + "' holds '" + text.substr(0, 64) + "', expected the tag of a step directory")
        .with_file(latest);
  if (!is_step_dir(path + "/" + text))
    return Status::Error("DeepSpeedLatest", "'" + latest + "' names '" + text + "', which holds no " + kModelStates12 + " or " + kModelStates3)
        .with_file(latest);
  *tag = text;
  return path + "/" + text;
}

struct RankFiles {
  std::vector<std::string> optim;  // by rank
  std::string prefix;              // "" or "bf16_"
};

// The rank files of a step directory: [bf16_]zero_pp_rank_R_mp_rank_00_optim_states.pt, R = 0..n-1.
Result<RankFiles> rank_files(const std::string& dir) {
  static const std::regex kOptim(R"(((?:bf16_)?)zero_pp_rank_(\d{1,6})_mp_rank_(\d{2,6})_optim_states\.pt)");
  std::map<int64_t, std::string> found;
  RankFiles out;
  bool prefix_set = false;
  std::error_code ec;
  size_t n = 0;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (++n > kMaxDirEntries) return not_zero(dir, "holds more than " + std::to_string(kMaxDirEntries) + " entries");
    const std::string name = it->path().filename().string();
    if (name.find("expp_rank_") != std::string::npos)
      return Status::Unsupported("'" + dir + "' holds expert-parallel files ('" + name + "'): DeepSpeed MoE checkpoints are not read yet")
          .with_file(dir + "/" + name);
    std::smatch m;
    if (!std::regex_match(name, m, kOptim)) continue;
    if (m[3].str() != std::string(m[3].length(), '0'))
      return Status::Unsupported("'" + dir + "' holds '" + name + "': tensor-parallel DeepSpeed checkpoints (mp_rank > 0) are not read yet")
          .with_file(dir + "/" + name);
    if (prefix_set && m[1].str() != out.prefix)
      return not_zero(dir + "/" + name, "the directory mixes bf16_ and plain optimizer files");
    out.prefix = m[1].str(), prefix_set = true;
    found[std::stoll(m[2].str())] = dir + "/" + name;
  }
  if (found.empty()) return not_zero(dir, "holds no *zero_pp_rank_R_mp_rank_00_optim_states.pt files (a ZeRO checkpoint's optimizer state)");
  const int64_t last = found.rbegin()->first;
  if (last >= static_cast<int64_t>(kMaxRanks)) return not_zero(dir, "names rank " + std::to_string(last));
  for (int64_t r = 0; r <= last; ++r) {
    auto it = found.find(r);
    if (it == found.end()) {
      const std::string missing = dir + "/" + out.prefix + "zero_pp_rank_" + std::to_string(r) + "_mp_rank_00_optim_states.pt";
      return Status::Error("DeepSpeedMissingRank", "'" + missing + "' is missing (the directory holds rank files up to " +
                                                       std::to_string(last) + ")").with_file(missing);
    }
    out.optim.push_back(it->second);
  }
  return out;
}

// The TensorSource: per tensor one whole piece, read by gathering its segments' runs.
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
      torch::TorchFile& f = *ranks_[seg.rank].file;
      const torch::TensorRef* ref = (*s.refs)[seg.rank][seg.group];
      std::optional<size_t> entry = f.storage_entry(ref->storage.key);
      if (!entry) return Status::Internal("no zip entry for storage '" + ref->storage.key + "'");
      const std::pair<const void*, size_t> key{&f, *entry};
      auto it = checked_.find(key);
      Status st = it != checked_.end() ? it->second : (checked_[key] = f.check_entry(*entry));
      if (!st.ok()) return std::move(st).with_tensor(pieces_[piece].tensor);
    }
    return Status::Ok();
  }

  IntegrityInfo integrity() const override {
    return {"DeepSpeed ZeRO torch files", "zip CRC-32",
            "DeepSpeed ZeRO torch files: `latest` and the file set have no checksum; CRC-32 finds damaged bytes, not deliberate edits"};
  }
  CheckReport check(const CheckOptions& o) override {
    CheckReport rep;
    uint64_t unit = 0, done = 0;
    auto on_bytes = [&](uint64_t n) {
      done += n;
      if (o.progress) o.progress(done, 0);
    };
    std::lock_guard<std::mutex> g(mu_);
    for (torch::TorchFile* f : all_files())
      torch::check_zip_entries(*f, o, &unit, f->path(), "", [](const std::string&) { return torch::ZipEntryOwner{}; }, on_bytes, rep);
    return rep;
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
    // The moments: of their partition's size (stages 1/2 keep the padding at the end of the moments).
    for (const RankOptim& r : s->ranks_)
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
    // The step: one for every group of every rank.
    std::optional<double> step;
    for (const RankOptim& r : s->ranks_)
      for (double v : r.steps) {
        if (step && *step != v)
          return Status::Error("DeepSpeedStepMismatch", "'" + r.path + "': Adam step " + std::to_string(v) + ", elsewhere " +
                                                            std::to_string(*step)).with_file(r.path);
        step = v;
      }
    s->add_tensors(!r0.exp_avg.empty());
    // Metadata.
    nlohmann::json ds = {{"stage", stage}, {"world", world}, {"tag", tag}, {"step_dir", s->dir_},
                         {"dtype", rf.prefix == "bf16_" ? "bf16" : "fp32"}};
    const PyObj* mroot = s->model_->root();
    if (const PyObj* v = mroot->get("ds_version"); v != nullptr && v->is(PyType::kStr) && v->s.size() < 64) ds["ds_version"] = v->s;
    if (const PyObj* v = mroot->get("global_steps"); v != nullptr && v->is(PyType::kInt)) ds["global_steps"] = v->i;
    if (step) ds["optimizer_step"] = static_cast<int64_t>(*step);
    if (!r0.no_state.empty()) ds["optimizer_not_imported"] = r0.no_state;
    if (rf.prefix != "bf16_") {  // fp16 or fp32: the module's dtype says which
      if (const PyObj* m = mroot->get("module"); m != nullptr && m->is(PyType::kDict) && !m->entries.empty() && m->entries[0].second->is(PyType::kTensor))
        ds["dtype"] = train_dtype(m->entries[0].second->tensor.storage.dtype);
    }
    ds["detected"] = "DeepSpeed ZeRO stage " + std::to_string(stage) + " checkpoint, " + std::to_string(world) + " data-parallel ranks, " +
                     ds["dtype"].get<std::string>() + " training, tag '" + tag + "', " + std::to_string(s->layouts_.size()) + " parameters" +
                     (r0.exp_avg.empty() ? " (no Adam state)" : " with Adam state");
    s->meta_["deepspeed"] = ds;
    nlohmann::json adam = torch_adam_hyper(r0.param_groups);
    if (!adam.empty()) s->meta_["adam"] = adam;
    for (const std::string& d : {path, s->dir_, fs::path(path).parent_path().string()}) {
      const std::string cfg = d + "/config.json";
      if (!fs::is_regular_file(cfg, ec)) continue;
      CKPT_ASSIGN_OR_RETURN(nlohmann::json j, read_json_file(cfg, kConfigJsonLimits, "config.json"));
      if (!j.is_object()) return Status::Error("InvalidConfig", "config.json is not a JSON object").with_file(cfg);
      s->meta_["model_config"] = std::move(j);
      s->meta_["deepspeed"]["config_json"] = cfg;
      break;
    }
    return std::unique_ptr<TensorSource>(std::move(s));
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
  std::map<std::pair<const void*, size_t>, Status> checked_;  // (file, zip entry) -> outcome of its CRC check
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
