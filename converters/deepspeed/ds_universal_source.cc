#include "converters/deepspeed/ds_universal_source.h"

#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <system_error>
#include <utility>
#include <vector>

#include "converters/deepspeed/deepspeed_files.h"
#include "converters/megatron/megatron_torch_optim.h"
#include "formats/base/json_read.h"
#include "formats/torch/torch_file.h"

namespace ckpt {

namespace ds_universal_detail {

namespace fs = std::filesystem;
using deepspeed_detail::kModelStates12;
using deepspeed_detail::kModelStates3;
using torch::PyObj;
using torch::PyType;
using torch::TensorRef;
using torch::TorchFile;

constexpr size_t kMaxOpenFiles = 16;  // state files kept open for reads (3 per parameter exist)

bool is_universal_step(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p / "zero" / "optimizer_state.pt", ec) &&
         (fs::is_regular_file(p / kModelStates12, ec) || fs::is_regular_file(p / kModelStates3, ec));
}

Status bad(const std::string& file, const std::string& msg) {
  return Status::Error("DeepSpeedUniversal", "'" + file + "': " + msg).with_file(file);
}

int64_t numel_of(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// The tensor of a state file (root['param'], or the root itself), dense, re-viewed as `shape`.
Result<TensorRef> state_tensor(TorchFile& f, const Shape& shape) {
  const PyObj* r = f.root();
  const PyObj* t = r->is(PyType::kDict) ? r->get("param") : r;
  if (t == nullptr || !t->is(PyType::kTensor)) return bad(f.path(), "holds no tensor (a dict's 'param', or a bare tensor)");
  TensorRef ref = t->tensor;
  if (numel_of(ref.size) != numel_of(shape))
    return bad(f.path(), "holds " + std::to_string(numel_of(ref.size)) + " elements, its parameter " + shape_to_string(shape) + " " +
                             std::to_string(numel_of(shape)));
  int64_t expect = 1;
  for (size_t d = ref.size.size(); d-- > 0;) {
    if (ref.size[d] != 1 && ref.stride[d] != expect) return bad(f.path(), "holds a tensor that is not dense row-major");
    expect *= ref.size[d];
  }
  if (!dtype_is_float(ref.storage.dtype)) return bad(f.path(), "holds a " + std::string(dtype_name(ref.storage.dtype)) + " tensor");
  ref.size.assign(shape.begin(), shape.end());
  ref.stride.assign(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) ref.stride[d - 1] = ref.stride[d] * shape[d];
  return ref;
}

// The tag latest_universal names (a plain directory name).
Result<std::string> latest_tag(const std::string& dir) {
  const std::string latest = dir + "/latest_universal";
  std::ifstream in(latest);
  std::string text(256, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\r')) text.pop_back();
  if (text.empty() || text.size() > 200 || text.find('/') != std::string::npos || text == "." || text == ".." ||
      !is_universal_step(dir + "/" + text))
    return Status::Error("DeepSpeedLatest", "'" + latest + "' holds '" + text.substr(0, 64) +
                                                "', expected the tag of a directory with zero/optimizer_state.pt and a model states file")
        .with_file(latest);
  return text;
}

bool plain_name(const std::string& n) {
  return !n.empty() && n != "." && n != ".." && n.size() <= 255 && n.find('/') == std::string::npos && n.find('\0') == std::string::npos;
}

class UniversalSource final : public TensorSource {
 public:
  const std::vector<TensorMeta>& tensors() const override { return tensors_; }
  const std::vector<Piece>& pieces() const override { return pieces_; }
  const nlohmann::json& metadata() const override { return meta_; }
  std::string describe() const override { return dir_; }

  Status read(size_t piece, const Box& sub, void* dst) override {
    if (piece >= items_.size()) return Status::Internal("DeepSpeed universal piece out of range");
    std::lock_guard<std::mutex> g(mu_);
    CKPT_ASSIGN_OR_RETURN(TorchFile * f, file(piece));
    Status st = f->read_tensor(items_[piece].ref, sub, dst);
    return st.ok() ? st : std::move(st).with_tensor(pieces_[piece].tensor);
  }

  Status check_piece(size_t piece) override {
    if (piece >= items_.size()) return Status::InvalidArgument("piece index " + std::to_string(piece) + " out of range");
    std::lock_guard<std::mutex> g(mu_);
    CKPT_ASSIGN_OR_RETURN(TorchFile * f, file(piece));
    Status st = checks_.check(*f, items_[piece].ref.storage.key);
    return st.ok() ? st : std::move(st).with_tensor(pieces_[piece].tensor);
  }

  IntegrityInfo integrity() const override {
    return {"DeepSpeed universal torch files", "zip CRC-32",
            "DeepSpeed universal torch files: the file set has no checksum; CRC-32 finds damaged bytes, not deliberate edits"};
  }

  CheckReport check(const CheckOptions& o) override {
    std::vector<torch::ZipCheckFile> files;  // each item's file, then the side files (no piece)
    for (size_t i = 0; i < items_.size(); ++i) files.push_back({nullptr, items_[i].path, {i, pieces_[i].tensor}});
    for (const std::string& f : side_files_) files.push_back({nullptr, f, {}});
    std::lock_guard<std::mutex> g(mu_);
    return torch::check_zip_files(files, o);
  }

  static Result<std::unique_ptr<TensorSource>> open(const std::string& path_in) {
    std::string path = path_in;
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    auto s = std::unique_ptr<UniversalSource>(new UniversalSource());
    std::string tag;
    if (is_universal_step(path)) {
      s->dir_ = path, tag = fs::path(path).filename().string();
    } else {
      CKPT_ASSIGN_OR_RETURN(tag, latest_tag(path));
      s->dir_ = path + "/" + tag;
    }
    std::error_code ec;
    const std::string states = s->dir_ + "/" + (fs::is_regular_file(s->dir_ + "/" + kModelStates12, ec) ? kModelStates12 : kModelStates3);
    CKPT_ASSIGN_OR_RETURN(auto mf, TorchFile::open(states));
    CKPT_ASSIGN_OR_RETURN(auto groups, deepspeed_detail::param_shapes(mf->root(), states));
    CKPT_RETURN_IF_ERROR(s->add_params(groups));
    CKPT_RETURN_IF_ERROR(s->add_metadata(path, *mf, tag));
    return std::unique_ptr<TensorSource>(std::move(s));
  }

 private:
  UniversalSource() = default;

  struct Item {
    std::string path;
    TensorRef ref;
  };

  Result<TorchFile*> file(size_t piece) {
    if (auto it = open_.find(piece); it != open_.end()) return it->second.get();
    CKPT_ASSIGN_OR_RETURN(auto f, TorchFile::open(items_[piece].path));
    if (open_.size() >= kMaxOpenFiles) {
      open_.erase(lru_.front());
      lru_.pop_front();
    }
    lru_.push_back(piece);
    return (open_[piece] = std::move(f)).get();
  }

  Status add_params(const std::vector<std::vector<DsParamShape>>& groups) {
    std::vector<DsParamShape> params;
    for (const auto& g : groups) params.insert(params.end(), g.begin(), g.end());
    std::vector<Item> items[3];
    const char* kStates[] = {"fp32", "exp_avg", "exp_avg_sq"};
    std::error_code ec;
    for (const DsParamShape& p : params) {
      const std::string pdir = dir_ + "/zero/" + p.name;
      if (!plain_name(p.name)) return bad(dir_, "parameter name '" + p.name.substr(0, 64) + "' cannot be a directory under zero/");
      for (int k = 0; k < 3; ++k) {
        const std::string f = pdir + "/" + kStates[k] + ".pt";
        if (!fs::is_regular_file(f, ec)) {
          if (k > 0) continue;
          return bad(f, "is missing: every parameter of param_shapes has zero/<name>/fp32.pt");
        }
        CKPT_ASSIGN_OR_RETURN(auto tf, TorchFile::open(f));
        CKPT_ASSIGN_OR_RETURN(TensorRef ref, state_tensor(*tf, p.shape));
        items[k].push_back({f, std::move(ref)});
      }
      if (fs::is_regular_file(pdir + "/step.pt", ec) && step_file_.empty()) step_file_ = pdir + "/step.pt";
    }
    for (int k = 1; k < 3; ++k)
      if (!items[k].empty() && items[k].size() != params.size())
        return bad(dir_ + "/zero", std::string(kStates[k]) + ".pt for " + std::to_string(items[k].size()) + " of " +
                                       std::to_string(params.size()) + " parameters (a universal checkpoint has it for all or none)");
    const bool adam = !items[1].empty() && !items[2].empty();
    for (int k = 0; k < (adam ? 3 : 1); ++k)
      for (size_t i = 0; i < params.size(); ++i) {
        const std::string name = (k == 0 ? "" : kMegatronOptimPrefixes[k - 1]) + params[i].name;
        const DType d = items[k][i].ref.storage.dtype;
        tensors_.push_back({name, d, params[i].shape});
        pieces_.push_back({name, Region{Box::whole(params[i].shape)}, d});
        items_.push_back(std::move(items[k][i]));
      }
    nparams_ = params.size();
    return Status::Ok();
  }

  // The Adam step: a step.pt, else optimizer_state.pt's optimizer_state_dict.state[0].step (stage 3).
  Result<std::optional<double>> adam_step(TorchFile& opt) {
    if (!step_file_.empty()) {
      CKPT_ASSIGN_OR_RETURN(auto f, TorchFile::open(step_file_));
      CKPT_ASSIGN_OR_RETURN(double v, deepspeed_detail::step_of(f->root(), *f, "step.pt"));
      return std::optional<double>(v);
    }
    const PyObj* osd = opt.root()->get("optimizer_state_dict");
    const PyObj* state = osd != nullptr ? osd->get("state") : nullptr;
    if (state == nullptr || !state->is(PyType::kDict) || state->entries.empty() || !state->entries[0].second->is(PyType::kDict))
      return std::optional<double>();
    const PyObj* v = state->entries[0].second->get("step");
    if (v == nullptr) return std::optional<double>();
    CKPT_ASSIGN_OR_RETURN(double d, deepspeed_detail::step_of(v, opt, "optimizer_state_dict['state'][0]"));
    return std::optional<double>(d);
  }

  Status add_metadata(const std::string& path, TorchFile& mf, const std::string& tag) {
    const std::string optf = dir_ + "/zero/optimizer_state.pt";
    CKPT_ASSIGN_OR_RETURN(auto opt, TorchFile::open(optf));
    side_files_ = {mf.path(), optf};
    if (!step_file_.empty()) side_files_.push_back(step_file_);
    nlohmann::json ds = {{"kind", "universal"}, {"tag", tag}, {"step_dir", dir_}};
    const PyObj* mroot = mf.root();
    if (const PyObj* v = mroot->get("ds_version"); v != nullptr && v->is(PyType::kStr) && v->s.size() < 64) ds["ds_version"] = v->s;
    if (const PyObj* v = mroot->get("global_steps"); v != nullptr && v->is(PyType::kInt)) ds["global_steps"] = v->i;
    const bool adam = tensors_.size() > nparams_;
    if (adam) {
      CKPT_ASSIGN_OR_RETURN(std::optional<double> step, adam_step(*opt));
      if (step) ds["optimizer_step"] = static_cast<int64_t>(*step);
    }
    ds["detected"] = "DeepSpeed universal checkpoint, tag '" + tag + "', " + std::to_string(nparams_) + " parameters" +
                     (adam ? " with Adam state" : " (no Adam state)");
    meta_["deepspeed"] = ds;
    const PyObj* groups = opt->root()->get("param_groups");
    if (groups == nullptr)
      if (const PyObj* osd = opt->root()->get("optimizer_state_dict"); osd != nullptr) groups = osd->get("param_groups");
    nlohmann::json hyper = torch_adam_hyper(groups);
    if (!hyper.empty()) meta_["adam"] = hyper;
    CKPT_RETURN_IF_ERROR(deepspeed_detail::read_config_beside({path, dir_, fs::path(dir_).parent_path().string()}, meta_));
    return Status::Ok();
  }

  std::string dir_, step_file_;
  std::vector<std::string> side_files_;
  size_t nparams_ = 0;
  std::vector<TensorMeta> tensors_;
  std::vector<Piece> pieces_;
  std::vector<Item> items_;
  nlohmann::json meta_ = nlohmann::json::object();
  std::mutex mu_;
  std::map<size_t, std::unique_ptr<TorchFile>> open_;
  std::deque<size_t> lru_;
  torch::StorageChecks checks_;
};

}  // namespace ds_universal_detail

bool is_deepspeed_universal_dir(const std::string& path) {
  namespace fs = std::filesystem;
  if (ds_universal_detail::is_universal_step(path)) return true;
  std::error_code ec;
  return fs::is_regular_file(fs::path(path) / "latest_universal", ec);  // a bad tag: DeepSpeedLatest at open
}

Result<std::unique_ptr<TensorSource>> open_deepspeed_universal(const std::string& path) {
  return ds_universal_detail::UniversalSource::open(path);
}

}  // namespace ckpt
