#include "converters/deepspeed/deepspeed_files.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <regex>
#include <system_error>
#include <utility>

#include "formats/base/json_read.h"

namespace ckpt {

namespace deepspeed_detail {

namespace fs = std::filesystem;
using torch::PyObj;
using torch::PyType;

constexpr size_t kMaxDirEntries = 1 << 16;  // entries of a step directory looked at
constexpr size_t kMaxRanks = 1 << 14;


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
      return Status::Error("DeepSpeedOptimizerState", "'" + file + "': " + sw + " is missing (param group " + std::to_string(g) + ")")
          .with_file(file);
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
Status read_config_beside(const std::vector<std::string>& dirs, nlohmann::json& meta) {
  std::error_code ec;
  for (const std::string& d : dirs) {
    const std::string cfg = d + "/config.json";
    if (!fs::is_regular_file(cfg, ec)) continue;
    CKPT_ASSIGN_OR_RETURN(nlohmann::json j, read_json_file(cfg, kConfigJsonLimits, "config.json"));
    if (!j.is_object()) return Status::Error("InvalidConfig", "config.json is not a JSON object").with_file(cfg);
    meta["model_config"] = std::move(j);
    meta["deepspeed"]["config_json"] = cfg;
    break;
  }
  return Status::Ok();
}

}  // namespace deepspeed_detail

}  // namespace ckpt
