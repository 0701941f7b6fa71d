#include "formats/torch/torch_file_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <random>
#include <unordered_set>

#include "formats/base/checked.h"
#include "formats/base/file_io.h"
#include "formats/torch/pickle/pickler.h"

namespace ckpt::torch {

namespace torch_writer_detail {

Status bad_tree(const std::string& msg) { return Status::Error("TorchWriteInvalid", msg); }

// Checks every storage and tensor reachable from `root` against the declared storages.
class StorageCheck {
 public:
  explicit StorageCheck(const std::vector<TorchStorage>& storages) {
    for (const auto& s : storages) by_key_[s.key] = &s;
  }
  Status walk(const PyObj* o, int depth) {
    if (o == nullptr || !seen_.insert(o).second) return Status::Ok();
    if (depth > 1000) return bad_tree("object tree deeper than 1000");
    if (o->is(PyType::kStorage)) return storage(o->storage);
    if (o->is(PyType::kTensor)) return tensor(o->tensor);
    for (const PyObj* it : o->items) CKPT_RETURN_IF_ERROR(walk(it, depth + 1));
    for (const auto& [k, v] : o->entries) {
      CKPT_RETURN_IF_ERROR(walk(k, depth + 1));
      CKPT_RETURN_IF_ERROR(walk(v, depth + 1));
    }
    CKPT_RETURN_IF_ERROR(walk(o->args, depth + 1));
    return walk(o->state, depth + 1);
  }

 private:
  std::map<std::string, const TorchStorage*> by_key_;
  std::unordered_set<const PyObj*> seen_;

  Status storage(const StorageRef& r) {
    auto it = by_key_.find(r.key);
    if (it == by_key_.end()) return bad_tree("the pickle names storage '" + r.key + "', which is not declared");
    if (it->second->dtype != r.dtype || it->second->numel != r.numel)
      return bad_tree("storage '" + r.key + "' is declared " + std::string(dtype_name(it->second->dtype)) + " x " +
                      std::to_string(it->second->numel) + " but the pickle names it " + std::string(dtype_name(r.dtype)) +
                      " x " + std::to_string(r.numel));
    return Status::Ok();
  }
  Status tensor(const TensorRef& t) {
    CKPT_RETURN_IF_ERROR(storage(t.storage));
    if (t.size.size() != t.stride.size() || t.storage_offset < 0)
      return bad_tree("a tensor over storage '" + t.storage.key + "' has " + std::to_string(t.size.size()) + " sizes, " +
                      std::to_string(t.stride.size()) + " strides, offset " + std::to_string(t.storage_offset));
    int64_t last = t.storage_offset;  // highest element index used
    bool empty = false;
    for (size_t d = 0; d < t.size.size(); ++d) {
      if (t.size[d] < 0 || t.stride[d] < 0) return bad_tree("a tensor over storage '" + t.storage.key + "' has a negative size or stride");
      if (t.size[d] == 0) empty = true;
      auto span = checked_mul(t.size[d] == 0 ? int64_t{0} : t.size[d] - 1, t.stride[d]);
      auto l = span ? checked_add(last, *span) : std::nullopt;
      if (!l) return bad_tree("a tensor over storage '" + t.storage.key + "' overflows");
      last = *l;
    }
    if (!empty && last >= t.storage.numel)
      return bad_tree("a tensor reaches element " + std::to_string(last) + " of storage '" + t.storage.key + "', which has " +
                      std::to_string(t.storage.numel));
    return Status::Ok();
  }
};

std::string random_serialization_id() {
  std::random_device rd;
  std::string s;
  for (int i = 0; i < 40; ++i) s += static_cast<char>('0' + rd() % 10);
  return s;
}

std::string archive_name_for(const std::string& path) {
  std::string base = path.substr(path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
  size_t dot = base.find_last_of('.');
  if (dot != std::string::npos && dot > 0) base = base.substr(0, dot);
  return base.empty() ? "archive" : base;
}

}  // namespace torch_writer_detail


Result<std::unique_ptr<TorchZipWriter>> TorchZipWriter::plan(const PyObj* root, std::vector<TorchStorage> storages,
                                                             const TorchWriteOptions& opts) {
  std::unique_ptr<TorchZipWriter> w(new TorchZipWriter());
  std::map<std::string, int> keys;
  for (const auto& s : storages) {
    if (s.key.empty() || s.key.find('/') != std::string::npos || !keys.emplace(s.key, 0).second || s.numel < 0)
      return torch_writer_detail::bad_tree("storage key '" + s.key + "' is empty, holds '/', is declared twice or has a negative size");
  }
  CKPT_RETURN_IF_ERROR(torch_writer_detail::StorageCheck(storages).walk(root, 0));
  CKPT_ASSIGN_OR_RETURN(w->pickle_, pickle_dumps(root));
  std::string a = opts.archive_name.empty() ? "archive" : opts.archive_name;
  std::vector<ZipEntrySpec> entries;
  auto small = [&](const std::string& name, std::string content) {
    entries.push_back(ZipEntrySpec{a + "/" + name, content.size()});
    w->small_.push_back(std::move(content));
  };
  small("data.pkl", w->pickle_);
  small(".format_version", "1");
  small(".storage_alignment", "64");
  small("byteorder", "little");
  w->first_storage_entry_ = entries.size();
  for (const auto& s : storages) {
    auto bytes = checked_mul(static_cast<uint64_t>(s.numel), static_cast<uint64_t>(dtype_size(s.dtype)));
    if (!bytes) return torch_writer_detail::bad_tree("storage '" + s.key + "' size overflows");
    entries.push_back(ZipEntrySpec{a + "/data/" + s.key, *bytes});
    w->small_.emplace_back();
  }
  small("version", "3\n");
  small(".data/serialization_id", opts.serialization_id.empty() ? torch_writer_detail::random_serialization_id() : opts.serialization_id);
  w->zip_ = ZipWriter(ZipWriterOptions{64, opts.force_zip64});
  CKPT_RETURN_IF_ERROR(w->zip_.layout(std::move(entries)));
  w->storages_ = std::move(storages);
  return w;
}

uint64_t TorchZipWriter::storage_bytes(size_t storage) const {
  return static_cast<uint64_t>(storages_[storage].numel) * dtype_size(storages_[storage].dtype);
}

void TorchZipWriter::attach(const OutputFile& out, uint64_t base, std::string what) {
  base_ = base;
  zip_.attach(out, base, std::move(what));
}

Status TorchZipWriter::write(size_t storage, const void* data, uint64_t bytes) {
  if (storage >= storages_.size()) return Status::Internal("TorchZipWriter::write: storage " + std::to_string(storage) + " out of range");
  return zip_.write(first_storage_entry_ + storage, data, bytes);
}

Status TorchZipWriter::write_from_file(size_t storage, int src_fd, uint64_t src_off, uint64_t bytes) {
  if (storage >= storages_.size()) return Status::Internal("TorchZipWriter::write: storage " + std::to_string(storage) + " out of range");
  return zip_.write_from_file(first_storage_entry_ + storage, src_fd, src_off, bytes);
}

Status TorchZipWriter::write_at(size_t storage, uint64_t offset, const void* data, uint64_t bytes) {
  if (storage >= storages_.size()) return Status::Internal("TorchZipWriter::write: storage " + std::to_string(storage) + " out of range");
  return zip_.write_at(first_storage_entry_ + storage, offset, data, bytes);
}

Status TorchZipWriter::write_from_file_at(size_t storage, uint64_t offset, int src_fd, uint64_t src_off, uint64_t bytes) {
  if (storage >= storages_.size()) return Status::Internal("TorchZipWriter::write: storage " + std::to_string(storage) + " out of range");
  return zip_.write_from_file_at(first_storage_entry_ + storage, offset, src_fd, src_off, bytes);
}

Status TorchZipWriter::finish() {
  for (size_t i = 0; i < small_.size(); ++i) {
    if (i >= first_storage_entry_ && i < first_storage_entry_ + storages_.size()) continue;
    CKPT_RETURN_IF_ERROR(zip_.write(i, small_[i].data(), small_[i].size()));
  }
  return zip_.finish();
}

TorchFileWriter::TorchFileWriter(std::string path, TorchWriteOptions opts) : path_(std::move(path)), opts_(std::move(opts)) {
  tmp_ = temp_path_for(path_);
  if (opts_.archive_name.empty()) opts_.archive_name = torch_writer_detail::archive_name_for(path_);
}

TorchFileWriter::~TorchFileWriter() {
  if (!committed_) abort();
}

Status TorchFileWriter::begin(const PyObj* root, std::vector<TorchStorage> storages) {
  if (zip_ || committed_) return Status::Internal("TorchFileWriter::begin called twice for '" + path_ + "'");
  auto z = TorchZipWriter::plan(root, std::move(storages), opts_);
  if (!z.ok()) return z.take_status().with_file(path_);
  CKPT_ASSIGN_OR_RETURN(out_, OutputFile::open(tmp_, O_WRONLY | O_CREAT | O_TRUNC, opts_.io, (*z)->size()));
  if (out_.direct()) out_.set_write_pool(opts_.write_pool);
  if (::ftruncate(out_.fd(), static_cast<off_t>((*z)->size())) != 0) {
    Status st = Status::FromErrno("cannot size", tmp_, errno);
    abort();
    return st;
  }
  zip_ = std::move(*z);
  zip_->attach(out_, 0, tmp_);
  return Status::Ok();
}

Status TorchFileWriter::write(size_t storage, const void* data, uint64_t bytes) {
  if (!zip_ || !out_.valid()) return Status::Internal("TorchFileWriter::write outside begin..commit for '" + path_ + "'");
  return zip_->write(storage, data, bytes);
}

Status TorchFileWriter::write_from_file(size_t storage, int src_fd, uint64_t src_off, uint64_t bytes) {
  if (!zip_ || !out_.valid()) return Status::Internal("TorchFileWriter::write outside begin..commit for '" + path_ + "'");
  return zip_->write_from_file(storage, src_fd, src_off, bytes);
}

Status TorchFileWriter::write_at(size_t storage, uint64_t offset, const void* data, uint64_t bytes) {
  if (!zip_ || !out_.valid()) return Status::Internal("TorchFileWriter::write outside begin..commit for '" + path_ + "'");
  return zip_->write_at(storage, offset, data, bytes);
}

Status TorchFileWriter::write_from_file_at(size_t storage, uint64_t offset, int src_fd, uint64_t src_off, uint64_t bytes) {
  if (!zip_ || !out_.valid()) return Status::Internal("TorchFileWriter::write outside begin..commit for '" + path_ + "'");
  return zip_->write_from_file_at(storage, offset, src_fd, src_off, bytes);
}

Status TorchFileWriter::commit() {
  if (!zip_ || !out_.valid()) return Status::Internal("TorchFileWriter::commit without begin for '" + path_ + "'");
  CKPT_RETURN_IF_ERROR(zip_->finish());
  CKPT_RETURN_IF_ERROR(out_.wait());  // storage writes still in flight on the pool
  if (opts_.fsync && ::fsync(out_.fd()) != 0) return Status::FromErrno("fsync failed", tmp_, errno);
  CKPT_RETURN_IF_ERROR(out_.close());
  CKPT_RETURN_IF_ERROR(commit_temp_file(tmp_, path_, opts_.fsync));
  committed_ = true;
  return Status::Ok();
}

void TorchFileWriter::abort() {
  if (committed_) return;
  bool had = out_.valid();
  out_.reset();
  if (had || path_exists(tmp_)) ::unlink(tmp_.c_str());
}

Status write_torch_file(const std::string& path, const PyObj* root, const std::vector<TorchStorage>& storages,
                        const std::vector<const void*>& data, const TorchWriteOptions& opts) {
  if (data.size() != storages.size()) return Status::Internal("write_torch_file: " + std::to_string(data.size()) + " buffers for " +
                                                              std::to_string(storages.size()) + " storages");
  TorchFileWriter w(path, opts);
  CKPT_RETURN_IF_ERROR(w.begin(root, storages));
  for (size_t i = 0; i < storages.size(); ++i) {
    uint64_t n = static_cast<uint64_t>(storages[i].numel) * dtype_size(storages[i].dtype);
    CKPT_RETURN_IF_ERROR(w.write(i, data[i], n));
  }
  return w.commit();
}

}  // namespace ckpt::torch
