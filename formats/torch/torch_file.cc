// torch.save zip files: open (archive prefix, byteorder, data.pkl, every storage and tensor
// checked), storage and tensor reads in place (docs/TORCH.md).
#include "formats/torch/torch_file.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <unordered_set>
#include <vector>

#include "formats/base/checked.h"
#include "formats/torch/zip/zip_archive.h"

namespace ckpt::torch {

// A named namespace, not an anonymous one: TorchFile::Impl derives from TorchFileState, and a base
// with internal linkage is an error (-Wsubobject-linkage) once unity builds include this file.
namespace torch_file_detail {

// What an open file holds (TorchFile::Impl; a separate name so file-local helpers can take it).
struct TorchFileState {
  std::string path;
  std::unique_ptr<ZipArchive> zip;
  std::string prefix;  // "archive/"
  Pickle pickle;
  std::map<std::string, ZipArchive::Entry> storages;  // key -> data/<key>
};

Status torchfile_err(const std::string& path, const char* code, const std::string& msg) {
  return Status::Error(code, "torch file: " + msg).with_file(path);
}

// The top folder holding data.pkl ("archive/" for torch >= 1.6; older files use the file stem).
Result<std::string> find_archive_prefix(ZipArchive& z) {
  uint64_t n = z.num_entries();
  for (uint64_t i = 0; i < n; ++i) {
    CKPT_ASSIGN_OR_RETURN(auto e, z.entry(i));
    size_t slash = e.name.find('/');
    if (slash != std::string::npos && slash > 0 && e.name.substr(slash) == "/data.pkl") return e.name.substr(0, slash + 1);
  }
  return torchfile_err(z.path(), "TorchNoDataPkl", "no <archive>/data.pkl entry: not a torch.save file");
}

// Every storage and tensor reachable from the root (cycles and shared objects visited once).
void torchfile_collect_tensors(const PyObj* root, std::vector<const PyObj*>* storages, std::vector<const PyObj*>* tensors) {
  std::unordered_set<const PyObj*> seen;
  std::vector<const PyObj*> todo{root};
  while (!todo.empty()) {
    const PyObj* o = todo.back();
    todo.pop_back();
    if (o == nullptr || !seen.insert(o).second) continue;
    if (o->is(PyType::kStorage)) storages->push_back(o);
    if (o->is(PyType::kTensor)) tensors->push_back(o);
    for (const PyObj* c : o->items) todo.push_back(c);
    for (const auto& [k, v] : o->entries) {
      todo.push_back(k);
      todo.push_back(v);
    }
    todo.push_back(o->args);
    todo.push_back(o->state);
  }
}

Status torchfile_check_storage(TorchFileState& f, const StorageRef& s) {
  auto bytes = checked_mul(static_cast<uint64_t>(s.numel), static_cast<uint64_t>(dtype_size(s.dtype)));
  std::string name = f.prefix + "data/" + s.key;
  auto it = f.storages.find(s.key);
  if (it == f.storages.end()) {
    CKPT_ASSIGN_OR_RETURN(auto e, f.zip->find(name));
    if (!e) return torchfile_err(f.path, "TorchStorageMissing", "the pickle names storage '" + s.key + "' but the zip has no entry '" + name + "'");
    it = f.storages.emplace(s.key, *e).first;
  }
  if (!bytes || *bytes != it->second.size)
    return torchfile_err(f.path, "TorchStorageSize", "storage '" + s.key + "' (" + std::string(dtype_name(s.dtype)) + "): the pickle says " +
                                                  std::to_string(s.numel) + " elements, entry '" + name + "' holds " +
                                                  std::to_string(it->second.size) + " bytes");
  return Status::Ok();
}

// The tensor's elements lie inside its storage: offset + sum((size-1)*stride) < numel.
Status torchfile_check_tensor(const std::string& path, const TensorRef& t) {
  auto ctx = [&] { return "tensor over storage '" + t.storage.key + "' (size " + shape_to_string(t.size) + ", stride " + shape_to_string(t.stride) +
                          ", offset " + std::to_string(t.storage_offset) + ")"; };
  auto numel = checked_numel(t.size);
  if (!numel) return torchfile_err(path, "TorchTensorOutOfStorage", ctx() + ": the size overflows");
  if (*numel == 0) return Status::Ok();
  int64_t last = t.storage_offset;
  for (size_t d = 0; d < t.size.size(); ++d) {
    auto step = checked_mul(t.size[d] - 1, t.stride[d]);
    auto sum = step ? checked_add(last, *step) : std::nullopt;
    if (!sum) return torchfile_err(path, "TorchTensorOutOfStorage", ctx() + ": its extent overflows");
    last = *sum;
  }
  if (last >= t.storage.numel)
    return torchfile_err(path, "TorchTensorOutOfStorage",
                         ctx() + ": reaches element " + std::to_string(last) + " of a storage of " + std::to_string(t.storage.numel));
  return Status::Ok();
}

Status torchfile_check_byteorder(TorchFileState& f) {
  CKPT_ASSIGN_OR_RETURN(auto bo, f.zip->find(f.prefix + "byteorder"));
  if (bo) {
    CKPT_ASSIGN_OR_RETURN(std::string s, f.zip->read_all(*bo, 64, "TorchByteOrder"));
    if (s != "little") return torchfile_err(f.path, "TorchByteOrder", "byteorder is '" + s.substr(0, 16) + "'; only 'little' is read");
  }
  return Status::Ok();
}

}  // namespace torch_file_detail

using namespace torch_file_detail;

struct TorchFile::Impl : TorchFileState {};

TorchFile::TorchFile() : impl_(std::make_unique<Impl>()) {}
TorchFile::~TorchFile() = default;

Result<std::unique_ptr<TorchFile>> TorchFile::open(const std::string& path, uint64_t offset, uint64_t length, const TorchFileLimits& limits) {
  std::unique_ptr<TorchFile> tf(new TorchFile());
  Impl& f = *tf->impl_;
  f.path = path;
  CKPT_ASSIGN_OR_RETURN(f.zip, ZipArchive::open(path, offset, length));
  CKPT_ASSIGN_OR_RETURN(f.prefix, find_archive_prefix(*f.zip));
  CKPT_RETURN_IF_ERROR(torchfile_check_byteorder(f));
  CKPT_ASSIGN_OR_RETURN(auto pe, f.zip->find(f.prefix + "data.pkl"));
  if (!pe) return torchfile_err(path, "TorchNoDataPkl", "no " + f.prefix + "data.pkl");
  CKPT_ASSIGN_OR_RETURN(std::string pkl, f.zip->read_all(*pe, limits.max_pickle_bytes, "TorchPickleTooLarge"));
  auto p = unpickle(pkl, limits.unpickle);
  if (!p.ok()) return p.take_status().with_file(path).with_context("data.pkl");
  f.pickle = std::move(p).value();
  std::vector<const PyObj*> storages, tensors;
  torchfile_collect_tensors(f.pickle.root, &storages, &tensors);
  for (const PyObj* s : storages) CKPT_RETURN_IF_ERROR(torchfile_check_storage(f, s->storage));
  for (const PyObj* t : tensors) {
    CKPT_RETURN_IF_ERROR(torchfile_check_storage(f, t->tensor.storage));
    CKPT_RETURN_IF_ERROR(torchfile_check_tensor(path, t->tensor));
  }
  return tf;
}

const PyObj* TorchFile::root() const { return impl_->pickle.root; }
const std::string& TorchFile::path() const { return impl_->path; }

Status TorchFile::read_storage(const std::string& key, uint64_t byte_offset, uint64_t bytes, void* dst) {
  auto it = impl_->storages.find(key);
  if (it == impl_->storages.end()) return torchfile_err(impl_->path, "TorchReadRange", "no storage '" + key + "' is named by the pickle");
  auto end = checked_add(byte_offset, bytes);
  if (!end || *end > it->second.size)
    return torchfile_err(impl_->path, "TorchReadRange", "read of " + std::to_string(bytes) + " bytes at " + std::to_string(byte_offset) +
                                                     " past the end of storage '" + key + "' (" + std::to_string(it->second.size) + " bytes)");
  return impl_->zip->read(it->second, byte_offset, bytes, dst);
}

std::optional<FileExtent> TorchFile::storage_extent(const std::string& key, uint64_t byte_offset, uint64_t bytes) {
  auto it = impl_->storages.find(key);
  auto end = checked_add(byte_offset, bytes);
  if (it == impl_->storages.end() || !end || *end > it->second.size) return std::nullopt;
  std::optional<uint64_t> at = impl_->zip->stored_data_offset(it->second);
  const int fd = at ? impl_->zip->data_fd() : -1;
  if (fd < 0) return std::nullopt;
  return FileExtent{fd, *at + byte_offset, bytes};
}

Result<std::vector<TorchFile::ZipEntryInfo>> TorchFile::zip_entries() const {
  std::map<uint64_t, std::string> key_of;
  for (const auto& [k, e] : impl_->storages) key_of[e.index] = k;
  std::vector<ZipEntryInfo> out;
  const uint64_t n = impl_->zip->num_entries();
  for (uint64_t i = 0; i < n; ++i) {
    CKPT_ASSIGN_OR_RETURN(ZipArchive::Entry e, impl_->zip->entry(i));
    auto k = key_of.find(i);
    out.push_back({e.name, e.size, k == key_of.end() ? std::string() : k->second});
  }
  return out;
}

Status TorchFile::check_entry(size_t i, const std::function<void(uint64_t)>& on_bytes) {
  CKPT_ASSIGN_OR_RETURN(ZipArchive::Entry e, impl_->zip->entry(i));
  return impl_->zip->check_crc(e, on_bytes);
}

void check_zip_entries(TorchFile& f, const CheckOptions& o, uint64_t* unit, const std::string& file, const std::string& context,
                       const std::function<ZipEntryOwner(const std::string&)>& owner,
                       const std::function<void(uint64_t)>& on_bytes, CheckReport& rep) {
  const uint64_t shares = static_cast<uint64_t>(std::max(1, o.shares));
  auto entries = f.zip_entries();
  if (!entries.ok()) {
    Status st = entries.take_status();
    if (!context.empty()) (void)std::move(st).with_context(context);
    rep.failures.push_back({CheckFailure::kNoPiece, std::move(st), "", file, ""});
    return;
  }
  for (size_t i = 0; i < entries->size(); ++i) {
    if ((*unit)++ % shares != static_cast<uint64_t>(o.share)) continue;
    const TorchFile::ZipEntryInfo& e = (*entries)[i];
    ++rep.pieces;
    rep.bytes += e.size;
    Status st = f.check_entry(i, on_bytes);
    if (st.ok()) continue;
    ZipEntryOwner who = e.storage.empty() ? ZipEntryOwner{} : owner(e.storage);
    if (!context.empty()) (void)std::move(st).with_context(context);
    if (!who.tensor.empty()) (void)std::move(st).with_tensor(who.tensor);
    rep.failures.push_back({who.piece, std::move(st), who.tensor, file, e.name});
  }
}

CheckReport check_zip_files(const std::vector<ZipCheckFile>& files, const CheckOptions& o, uint64_t total) {
  CheckReport rep;
  uint64_t unit = 0, done = 0;
  auto on_bytes = [&](uint64_t n) {
    done += n;
    if (o.progress) o.progress(done, total);
  };
  for (const ZipCheckFile& z : files) {
    std::unique_ptr<TorchFile> opened;
    TorchFile* f = z.file;
    if (!f) {
      auto r = TorchFile::open(z.path);
      if (!r.ok()) {
        rep.failures.push_back({z.owner.piece, r.take_status(), z.owner.tensor, z.path, ""});
        continue;
      }
      f = (opened = std::move(*r)).get();
    }
    const ZipEntryOwner& who = z.owner;
    check_zip_entries(*f, o, &unit, f->path(), "", [&who](const std::string&) { return who; }, on_bytes, rep);
  }
  return rep;
}

Status StorageChecks::check(TorchFile& f, const std::string& key) {
  std::optional<size_t> entry = f.storage_entry(key);
  if (!entry) return Status::Internal("no zip entry for storage '" + key + "' in '" + f.path() + "'");
  std::lock_guard<std::mutex> g(mu_);
  auto [it, fresh] = done_.try_emplace({f.path(), *entry});
  if (fresh) it->second = f.check_entry(*entry);
  return it->second;
}

std::optional<size_t> TorchFile::storage_entry(const std::string& key) const {
  auto it = impl_->storages.find(key);
  if (it == impl_->storages.end()) return std::nullopt;
  return static_cast<size_t>(it->second.index);
}

}  // namespace ckpt::torch
