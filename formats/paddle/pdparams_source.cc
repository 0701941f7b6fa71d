// PdparamsSource: one .pdparams file or the shards of model_state.pdparams.index.json, checked as
// a set (every listed file present, each tensor in exactly one file, index and files agreeing),
// reads pread from the arrays' data ranges.
#include <fcntl.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>

#include "formats/base/file_io.h"
#include "formats/base/json_read.h"
#include "formats/paddle/pdparams.h"

namespace ckpt::paddle {

namespace fs = std::filesystem;

namespace {

// Bytes of one .pdparams file read into memory to be parsed (the arrays stay there only while it is).
constexpr uint64_t kMaxPdparamsBytes = uint64_t{1} << 40;

Result<std::string> read_whole(int fd, const std::string& path) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return Status::Io("cannot stat '" + path + "'");
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size > kMaxPdparamsBytes) return Status::Error("PdparamsSizeMismatch", "'" + path + "' is larger than 1 TiB");
  std::string bytes(size, '\0');
  CKPT_RETURN_IF_ERROR(pread_full(fd, bytes.data(), size, 0, path));
  return bytes;
}

bool plain_pdparams_name(const std::string& f) {
  return !f.empty() && f.size() <= 255 && f.find('/') == std::string::npos && f.find('\\') == std::string::npos && f != "." &&
         f != ".." && f.find('\0') == std::string::npos && f.ends_with(".pdparams");
}

// model_state.pdparams.index.json: {"weight_map": {name: file}, "metadata": {...}}.
Result<std::map<std::string, std::string>> read_pdparams_index(const std::string& path) {
  CKPT_ASSIGN_OR_RETURN(nlohmann::json j, read_json_file(path, kIndexJsonLimits, "pdparams index"));
  auto bad = [&](const std::string& why) { return Status::Error("IndexInvalid", "pdparams index: " + why).with_file(path); };
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) return bad("no \"weight_map\" object");
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : j["weight_map"].items()) {
    if (!v.is_string()) return bad("weight_map['" + k + "'] is not a string");
    const std::string f = v.get<std::string>();
    if (!plain_pdparams_name(f))
      return Status::Error("IndexBadFileName", "pdparams index: weight_map['" + k + "'] = '" + f.substr(0, 80) +
                                                   "' is not a plain .pdparams file name").with_file(path);
    out[k] = f;
  }
  return out;
}

}  // namespace

Status PdparamsSource::add_file(const std::string& file, const std::set<std::string>* expected) {
  CKPT_ASSIGN_OR_RETURN(ScopedFd fd, open_fd(file, O_RDONLY, "pdparams file"));
  PdparamsContents c;
  {
    CKPT_ASSIGN_OR_RETURN(std::string bytes, read_whole(fd.get(), file));
    auto parsed = parse_pdparams(bytes);
    if (!parsed.ok()) return parsed.take_status().with_file(file);
    c = std::move(*parsed);
  }
  const size_t fi = files_.size();
  files_.push_back(file);
  fds_.push_back(std::move(fd));
  for (PdparamsArray& a : c.arrays) {
    for (const TensorMeta& m : metas_)
      if (m.name == a.name)
        return Status::Error("DuplicateTensor", "tensor '" + a.name + "' is stored twice (second time in '" + file + "')").with_tensor(a.name);
    if (expected != nullptr && !expected->count(a.name))
      return Status::Error("IndexMismatch", "tensor '" + a.name + "' of '" + file + "' is not listed for this file in the index")
          .with_tensor(a.name);
    metas_.push_back(TensorMeta{a.name, a.dtype, a.shape});
    pieces_.push_back(Piece{a.name, Region{Box::whole(a.shape)}, a.dtype});
    file_of_.push_back(fi);
    arrays_.push_back(std::move(a));
  }
  if (!c.name_map.empty()) {
    nlohmann::json& m = meta_["pdparams_name_map"];
    for (const auto& [k, v] : c.name_map) m[k] = v;
  }
  return Status::Ok();
}

Result<std::unique_ptr<PdparamsSource>> PdparamsSource::open(const std::string& path) {
  auto s = std::unique_ptr<PdparamsSource>(new PdparamsSource());
  s->path_ = path;
  std::error_code ec;
  const fs::path dir(path);
  if (!fs::is_directory(dir, ec)) {
    CKPT_RETURN_IF_ERROR(s->add_file(path, nullptr));
    return s;
  }
  if (!fs::exists(dir / kPdparamsIndexName, ec)) {
    CKPT_RETURN_IF_ERROR(s->add_file((dir / kPdparamsFileName).string(), nullptr));
    return s;
  }
  const std::string index = (dir / kPdparamsIndexName).string();
  CKPT_ASSIGN_OR_RETURN(auto weight_map, read_pdparams_index(index));
  std::map<std::string, std::set<std::string>> by_file;
  for (const auto& [t, f] : weight_map) by_file[f].insert(t);
  for (const auto& [f, names] : by_file)  // the whole set present before any file is parsed
    if (!fs::exists(dir / f, ec)) return Status::Error("IndexMissingFile", "pdparams index lists '" + f + "', which does not exist").with_file(index);
  for (const auto& [f, names] : by_file) CKPT_RETURN_IF_ERROR(s->add_file((dir / f).string(), &names));
  for (const auto& [t, f] : weight_map) {
    bool found = false;
    for (const TensorMeta& m : s->metas_) found = found || m.name == t;
    if (!found)
      return Status::Error("IndexMismatch", "the index lists tensor '" + t + "' in '" + f + "', which does not hold it").with_file(index);
  }
  return s;
}

Status PdparamsSource::read(size_t piece, const Box& sub, void* dst) {
  if (piece >= arrays_.size()) return Status::InvalidArgument("piece " + std::to_string(piece) + " out of range");
  const PdparamsArray& a = arrays_[piece];
  CKPT_RETURN_IF_ERROR(validate_box(sub, a.shape));
  const uint64_t es = dtype_size(a.dtype);
  const size_t nd = a.shape.size();
  if (sub.numel() == 0) return Status::Ok();
  std::vector<uint64_t> stride(nd, 1);
  for (size_t d = nd; d-- > 1;) stride[d - 1] = stride[d] * static_cast<uint64_t>(a.shape[d]);
  size_t k = 0;  // the last dimension not taken whole: runs of sub.extent[k] * stride[k] elements
  for (size_t d = nd; d-- > 0;)
    if (sub.offset[d] != 0 || sub.extent[d] != a.shape[d]) {
      k = d;
      break;
    }
  const uint64_t run = nd == 0 ? es : static_cast<uint64_t>(sub.extent[k]) * stride[k] * es;
  uint64_t nruns = 1;
  for (size_t d = 0; d < k; ++d) nruns *= static_cast<uint64_t>(sub.extent[d]);
  std::vector<int64_t> idx(k, 0);
  auto* out = static_cast<uint8_t*>(dst);
  for (uint64_t r = 0; r < nruns; ++r, out += run) {
    uint64_t elem = nd == 0 ? 0 : static_cast<uint64_t>(sub.offset[k]) * stride[k];
    for (size_t d = 0; d < k; ++d) elem += static_cast<uint64_t>(sub.offset[d] + idx[d]) * stride[d];
    if (!a.inline_data.empty())
      std::memcpy(out, a.inline_data.data() + elem * es, run);
    else
      CKPT_RETURN_IF_ERROR(pread_full(fds_[file_of_[piece]].get(), out, run, a.offset + elem * es, files_[file_of_[piece]]));
    for (size_t d = k; d-- > 0;) {
      if (++idx[d] < sub.extent[d]) break;
      idx[d] = 0;
    }
  }
  return Status::Ok();
}

std::optional<FileExtent> PdparamsSource::file_extent(size_t piece, const Box& sub) {
  if (piece >= arrays_.size() || !arrays_[piece].inline_data.empty()) return std::nullopt;
  const PdparamsArray& a = arrays_[piece];
  const std::optional<int64_t> start = row_major_run_start(Box::whole(a.shape), sub);
  if (!start) return std::nullopt;
  const uint64_t es = dtype_size(a.dtype);
  return FileExtent{fds_[file_of_[piece]].get(), a.offset + static_cast<uint64_t>(*start) * es, static_cast<uint64_t>(sub.numel()) * es};
}

PieceStorage PdparamsSource::piece_storage(size_t piece) {
  if (piece >= arrays_.size()) return {};
  return {fs::path(files_[file_of_[piece]]).filename().string(), arrays_[piece].bytes, ""};
}

}  // namespace ckpt::paddle
