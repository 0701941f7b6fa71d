#include "formats/safetensors/st_dir.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>

#include "formats/base/checked.h"

namespace ckpt::safetensors {

namespace fs = std::filesystem;

Status HfDirSource::add_file(std::unique_ptr<SafetensorsFile> f) {
  size_t fi = files_.size();
  for (size_t i = 0; i < f->tensors().size(); ++i) {
    metas_.push_back(f->tensors()[i]);
    pieces_.push_back(f->pieces()[i]);
    where_.emplace_back(fi, i);
  }
  files_.push_back(std::move(f));
  return Status::Ok();
}

Status HfDirSource::load_config(const std::string& dir) {
  fs::path cfg = fs::path(dir) / "config.json";
  std::error_code ec;
  if (!fs::is_regular_file(cfg, ec)) return Status::Ok();
  CKPT_ASSIGN_OR_RETURN(nlohmann::json j, read_json_file(cfg.string(), kConfigJsonLimits, "config.json"));
  if (!j.is_object()) return Status::Error("InvalidConfig", "config.json is not a JSON object").with_file(cfg.string());
  meta_["model_config"] = std::move(j);
  return Status::Ok();
}

Result<std::unique_ptr<HfDirSource>> HfDirSource::open_file(const std::string& file) {
  std::unique_ptr<HfDirSource> s(new HfDirSource());
  s->path_ = file;
  CKPT_ASSIGN_OR_RETURN(auto f, SafetensorsFile::open(file));
  if (f->metadata().contains("safetensors_metadata")) s->meta_["safetensors_metadata"] = f->metadata()["safetensors_metadata"];
  CKPT_RETURN_IF_ERROR(s->add_file(std::move(f)));
  auto parent = fs::path(file).parent_path().string();
  CKPT_RETURN_IF_ERROR(s->load_config(parent.empty() ? "." : parent));
  return s;
}

Result<std::unique_ptr<HfDirSource>> HfDirSource::open(const std::string& dir) {
  std::error_code ec;
  fs::path idx_path = fs::path(dir) / kIndexFileName;
  fs::path single = fs::path(dir) / kSingleFileName;
  if (!fs::exists(idx_path, ec)) {
    if (!fs::exists(single, ec))
      return Status::NotFound("'" + dir + "' holds neither " + std::string(kIndexFileName) + " nor " + kSingleFileName);
    CKPT_ASSIGN_OR_RETURN(auto s, open_file(single.string()));
    s->path_ = dir;
    return s;
  }
  std::unique_ptr<HfDirSource> s(new HfDirSource());
  s->path_ = dir;
  CKPT_ASSIGN_OR_RETURN(ShardIndex idx, read_index(idx_path.string()));
  s->meta_["hf_index_metadata"] = idx.metadata;
  if (idx.weight_map.empty())
    return Status::Error("IndexInvalid", "safetensors index: weight_map lists no tensors").with_file(idx_path.string());
  // Every listed file present; every file's tensors exactly the ones the index maps to it.
  std::set<std::string> seen;
  for (const auto& name : idx.files) {
    fs::path p = fs::path(dir) / name;
    if (!fs::is_regular_file(p, ec))
      return Status::Error("IndexMissingFile",
                           "index lists shard '" + name + "', which is missing from '" + dir + "'").with_file(idx_path.string());
    CKPT_ASSIGN_OR_RETURN(auto f, SafetensorsFile::open(p.string()));
    for (const auto& t : f->tensors()) {
      auto it = idx.weight_map.find(t.name);
      if (it == idx.weight_map.end())
        return Status::Error("IndexMismatch", "shard '" + name + "' holds tensor '" + t.name + "', which the index does not list")
            .with_file(p.string()).with_tensor(t.name);
      if (it->second != name)
        return Status::Error("IndexMismatch", "tensor '" + t.name + "' is in shard '" + name + "' but the index maps it to '" +
                                                       it->second + "'").with_file(p.string()).with_tensor(t.name);
      if (!seen.insert(t.name).second)
        return Status::Error("DuplicateTensor", "tensor '" + t.name + "' is stored twice").with_file(p.string()).with_tensor(t.name);
    }
    if (s->files_.empty() && f->metadata().contains("safetensors_metadata"))
      s->meta_["safetensors_metadata"] = f->metadata()["safetensors_metadata"];
    CKPT_RETURN_IF_ERROR(s->add_file(std::move(f)));
  }
  for (const auto& [t, file] : idx.weight_map)
    if (!seen.count(t))
      return Status::Error("IndexMismatch", "index maps tensor '" + t + "' to '" + file + "', which does not hold it")
          .with_file(idx_path.string()).with_tensor(t);
  CKPT_RETURN_IF_ERROR(s->load_config(dir));
  return s;
}

std::optional<FileExtent> HfDirSource::file_extent(size_t piece, const Box& sub) {
  if (piece >= where_.size()) return std::nullopt;
  return files_[where_[piece].first]->file_extent(where_[piece].second, sub);
}

Status HfDirSource::read(size_t piece, const Box& sub, void* dst) {
  if (piece >= where_.size()) return Status::InvalidArgument("piece " + std::to_string(piece) + " out of range in '" + path_ + "'");
  return files_[where_[piece].first]->read(where_[piece].second, sub, dst);
}

SafetensorsDirWriter::SafetensorsDirWriter(std::string out_dir, bool fsync, IoMode io)
    : dir_(std::move(out_dir), PartialDirPolicy{.replace_stale = false, .empty_target_ok = true}), fsync_(fsync), io_(io) {}

SafetensorsDirWriter::~SafetensorsDirWriter() {
  if (!committed_) abort();
}

Status SafetensorsDirWriter::create() {
  if (created_) return Status::Internal("SafetensorsDirWriter::create called twice");
  CKPT_RETURN_IF_ERROR(dir_.create());
  created_ = true;
  return Status::Ok();
}

Result<SafetensorsWriter*> SafetensorsDirWriter::add_file(const std::string& rel, const std::vector<TensorMeta>& tensors,
                                                          const std::vector<Piece>& pieces,
                                                          const std::map<std::string, std::string>& header_metadata) {
  if (!created_) return Status::Internal("SafetensorsDirWriter::add_file before create");
  const fs::path r(rel);
  bool bad = rel.empty() || r.is_absolute() || std::distance(r.begin(), r.end()) > 2;
  for (const auto& part : r) bad = bad || part == "." || part == ".." || part.empty();
  if (bad) return Status::InvalidArgument("bad file name '" + rel + "' in a safetensors directory");
  if (r.has_parent_path() && std::find(subdirs_.begin(), subdirs_.end(), r.parent_path().string()) == subdirs_.end()) {
    CKPT_RETURN_IF_ERROR(make_dir((fs::path(dir_.path()) / r.parent_path()).string()));
    subdirs_.push_back(r.parent_path().string());
  }
  WriterOptions wo;
  wo.metadata = header_metadata;
  wo.rename_on_commit = false;
  wo.fsync = fsync_;
  wo.io = io_;
  wo.read_ahead = read_ahead_;
  wo.write_pool = write_pool_;
  writers_.push_back(std::make_unique<SafetensorsWriter>((fs::path(dir_.path()) / r).string(), wo));
  CKPT_RETURN_IF_ERROR(writers_.back()->begin(tensors, pieces, nlohmann::json::object()));
  return writers_.back().get();
}

Status SafetensorsDirWriter::commit(const std::map<std::string, std::string>& text_files,
                                    const std::map<std::string, std::string>& copy_files) {
  if (!created_) return Status::Internal("SafetensorsDirWriter::commit without create");
  for (auto& w : writers_) CKPT_RETURN_IF_ERROR(w->commit());
  for (const auto& [name, content] : text_files)
    CKPT_RETURN_IF_ERROR(write_file(dir_.path() + "/" + name, content, fsync_));
  for (const auto& [name, src] : copy_files) {
    std::error_code ec;
    fs::copy_file(src, dir_.path() + "/" + name, fs::copy_options::overwrite_existing, ec);
    if (ec) return Status::FromErrno("cannot copy '" + src + "' to", dir_.path() + "/" + name, ec.value());
  }
  if (fsync_)
    for (const auto& d : subdirs_) CKPT_RETURN_IF_ERROR(fsync_dir(dir_.path() + "/" + d));
  CKPT_RETURN_IF_ERROR(dir_.commit(fsync_));
  committed_ = true;
  return Status::Ok();
}

void SafetensorsDirWriter::abort() {
  if (!created_ || committed_) return;
  for (auto& w : writers_) w->abort();
  writers_.clear();
  dir_.remove();
  created_ = false;
}

ShardedSafetensorsSink::ShardedSafetensorsSink(std::string out_dir, ShardedSinkOptions opts)
    : opts_(std::move(opts)), dir_(std::move(out_dir), opts_.fsync, opts_.io) {
  dir_.set_read_ahead(opts_.read_ahead);
  dir_.set_write_pool(opts_.write_pool);
}

ShardedSafetensorsSink::~ShardedSafetensorsSink() = default;  // dir_ aborts unless committed

Status ShardedSafetensorsSink::begin(const std::vector<TensorMeta>& tensors, const std::vector<Piece>& pieces, const nlohmann::json&) {
  if (begun_) return Status::Internal("ShardedSafetensorsSink::begin called twice");
  for (const auto& [name, _] : opts_.extra_files)
    if (name.empty() || name.find('/') != std::string::npos || name == kIndexFileName)
      return Status::InvalidArgument("bad extra file name '" + name + "'");
  std::map<std::string, const TensorMeta*> by_name;
  for (const auto& t : tensors) by_name[t.name] = &t;
  std::vector<uint64_t> sizes;
  for (const auto& p : pieces) {
    auto it = by_name.find(p.tensor);
    if (it == by_name.end()) return Status::InvalidArgument("piece names undeclared tensor '" + p.tensor + "'");
    auto n = checked_numel(it->second->shape);
    auto b = n ? checked_mul(static_cast<uint64_t>(*n), static_cast<uint64_t>(dtype_size(p.dtype))) : std::nullopt;
    if (!b) return Status::InvalidArgument("tensor '" + p.tensor + "' size overflows");
    sizes.push_back(*b);
    auto t = checked_add(total_size_, *b);
    if (!t) return Status::InvalidArgument("total size overflows");
    total_size_ = *t;
  }
  size_t nshards = 0;
  auto shard_of = assign_shards(sizes, opts_.max_shard_size, &nshards);
  for (size_t s = 0; s < nshards; ++s) names_.push_back(nshards == 1 ? std::string(kSingleFileName) : hf_shard_file_name(s, nshards));
  CKPT_RETURN_IF_ERROR(dir_.create());
  begun_ = true;
  std::vector<std::vector<TensorMeta>> st(nshards);
  std::vector<std::vector<Piece>> sp(nshards);
  where_.resize(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    size_t s = shard_of[i];
    where_[i] = {s, sp[s].size()};
    st[s].push_back(*by_name[pieces[i].tensor]);
    sp[s].push_back(pieces[i]);
    weight_map_[pieces[i].tensor] = names_[s];
  }
  for (size_t s = 0; s < nshards; ++s) {
    CKPT_ASSIGN_OR_RETURN(SafetensorsWriter * w, dir_.add_file(names_[s], st[s], sp[s], opts_.shard_metadata));
    writers_.push_back(w);
  }
  return Status::Ok();
}

Status ShardedSafetensorsSink::write(size_t piece, const void* data, int64_t count) {
  if (piece >= where_.size()) return Status::Internal("ShardedSafetensorsSink::write: piece out of range");
  return writers_[where_[piece].first]->write(where_[piece].second, data, count);
}

std::vector<size_t> ShardedSafetensorsSink::write_order() const {
  std::vector<size_t> order(where_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto key = [&](size_t i) { return std::pair{where_[i].first, writers_[where_[i].first]->piece_offset(where_[i].second)}; };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key(a) < key(b); });
  return order;
}

Status ShardedSafetensorsSink::write_from_file(size_t piece, const FileExtent& src, int64_t count) {
  if (piece >= where_.size()) return Status::Internal("ShardedSafetensorsSink::write_from_file: piece out of range");
  return writers_[where_[piece].first]->write_from_file(where_[piece].second, src, count);
}

Status ShardedSafetensorsSink::write_from_files(size_t piece, const std::vector<FileExtent>& runs, int64_t count) {
  if (piece >= where_.size()) return Status::Internal("ShardedSafetensorsSink::write_from_files: piece out of range");
  return writers_[where_[piece].first]->write_from_files(where_[piece].second, runs, count);
}

Status ShardedSafetensorsSink::commit() {
  if (!begun_) return Status::Internal("ShardedSafetensorsSink::commit without begin");
  std::map<std::string, std::string> text = opts_.extra_files;
  if (names_.size() > 1) text[kIndexFileName] = index_to_json(total_size_, weight_map_);
  return dir_.commit(text, opts_.copy_files);
}

void ShardedSafetensorsSink::abort() {
  if (!begun_) return;
  writers_.clear();
  dir_.abort();
  begun_ = false;
}

PieceStorage HfDirSource::piece_storage(size_t piece) {
  if (piece >= pieces_.size()) return {};
  std::string name = files_[where_[piece].first]->path();
  if (auto slash = name.rfind('/'); slash != std::string::npos) name = name.substr(slash + 1);
  const Piece& p = pieces_[piece];
  return {name, static_cast<uint64_t>(p.region.numel()) * dtype_size(p.dtype), ""};
}

}  // namespace ckpt::safetensors
