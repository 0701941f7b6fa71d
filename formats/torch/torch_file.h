// A torch.save file (the zip format): <archive>/data.pkl, <archive>/data/<key> storages,
// <archive>/byteorder ("little" only), <archive>/version; also one embedded at a byte range of a
// larger file (DCP .distcp items). Opened through libzip (ZIP64 included); data.pkl is read with a
// size bound and unpickled by the restricted unpickler; storages are read in place with
// zip_fseek/zip_fread from the stored (uncompressed) entry, never inflated whole into memory
// (a compressed storage is inflated only as far as a read needs, with the entry's size bound);
// a stored storage is read with pread at its offset in the file and offered as a file range
// (storage_extent / tensor_extent) for file-to-file copies.
// At open, every storage the pickle names is checked: present, byte size == numel * element size,
// every tensor's (storage_offset, size, stride) inside its storage (no negative strides).
// Integrity: every zip entry carries a CRC-32 (zip_entries / check_entry recompute it from the
// bytes, streamed; ZipCrcMismatch names the entry and both values).
// Thread safety: one thread at a time (libzip handles are not shared between threads).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "formats/base/status.h"
#include "formats/tensor/region.h"
#include "formats/tensor/tensor_io.h"
#include "formats/torch/pickle/py_object.h"
#include "formats/torch/pickle/unpickler.h"

namespace ckpt::torch {

struct TorchFileLimits {
  uint64_t max_pickle_bytes = 1ull << 31;  // data.pkl (a zip bomb's data.pkl fails here)
  UnpickleLimits unpickle;
};

class TorchFile {
 public:
  // `offset`/`length`: the zip lies at that byte range of `path` (length UINT64_MAX: to the end).
  static Result<std::unique_ptr<TorchFile>> open(const std::string& path, uint64_t offset = 0,
                                                 uint64_t length = UINT64_MAX,
                                                 const TorchFileLimits& limits = {});
  ~TorchFile();

  const PyObj* root() const;
  const std::string& path() const;
  // Reads `bytes` bytes at `byte_offset` of storage `key` (checked against its size).
  Status read_storage(const std::string& key, uint64_t byte_offset, uint64_t bytes, void* dst);
  // Reads the sub-box `sub` (coordinates of the tensor, 0-based) of tensor `t` into `dst`, dense
  // row-major, in t.storage.dtype, honouring storage offset and strides (views of a shared
  // storage, transposed tensors). Contiguous runs are read as single ranges.
  Status read_tensor(const TensorRef& t, const Box& sub, void* dst);
  // Where bytes [byte_offset, byte_offset + bytes) of storage `key` lie as they are in path()
  // (a stored, uncompressed entry), so a sink can copy them file to file; nullopt otherwise
  // (deflated entry, range outside the storage). The descriptor is owned by this TorchFile.
  std::optional<FileExtent> storage_extent(const std::string& key, uint64_t byte_offset, uint64_t bytes);
  // The same for the sub-box `sub` of tensor `t` when read_tensor would return one contiguous run
  // of its storage (a row-major run of a contiguous tensor); nullopt otherwise.
  std::optional<FileExtent> tensor_extent(const TensorRef& t, const Box& sub);

  // The zip's entries, by index (every entry, not only storages): name, uncompressed size, and
  // the storage key when the entry is <archive>/data/<key> of a storage the pickle names.
  struct ZipEntryInfo {
    std::string name;
    uint64_t size = 0;
    std::string storage;  // "" when no storage
  };
  Result<std::vector<ZipEntryInfo>> zip_entries() const;
  // Recomputes entry `i`'s CRC-32 and compares it with the zip's (ZipArchive::check_crc);
  // `on_bytes(n)` after each chunk hashed.
  Status check_entry(size_t i, const std::function<void(uint64_t)>& on_bytes = nullptr);
  // The zip_entries() index of storage `key`'s entry; nullopt when the pickle names no such storage.
  std::optional<size_t> storage_entry(const std::string& key) const;

 private:
  TorchFile();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// What a source over torch.save zips reports for one entry: the piece it holds and its tensor
// ({CheckFailure::kNoPiece, ""} for entries holding no piece: data.pkl, version, ...).
struct ZipEntryOwner {
  size_t piece = CheckFailure::kNoPiece;
  std::string tensor;
};

// The CRC-32 check of every entry of `f` whose unit number (*unit, counted on per entry across
// calls) is in share o.share of o.shares, added to `rep` (units, bytes, failures: piece and tensor
// from `owner(storage key)`, file `file`, unit the entry name, `context` prepended to the error);
// `on_bytes(n)` after each chunk hashed.
void check_zip_entries(TorchFile& f, const CheckOptions& o, uint64_t* unit, const std::string& file, const std::string& context,
                       const std::function<ZipEntryOwner(const std::string&)>& owner,
                       const std::function<void(uint64_t)>& on_bytes, CheckReport& rep);

// One file of check_zip_files: an open file, or (file null) a path opened for the check alone;
// every storage of the file belongs to `owner` (a failure to open it too).
struct ZipCheckFile {
  TorchFile* file = nullptr;
  std::string path;
  ZipEntryOwner owner;
};

// check_zip_entries over `files` in order (units counted on across them); o.progress hears the bytes
// hashed so far, of `total` (0: unknown).
CheckReport check_zip_files(const std::vector<ZipCheckFile>& files, const CheckOptions& o, uint64_t total = 0);

// The CRC-32 checks of storages' zip entries for a source's check_piece: each (file path, entry)
// checked once, its outcome kept for every later call. Thread-safe; the caller holds whatever lock
// guards `f`'s libzip handle.
class StorageChecks {
 public:
  // Status::Internal when the pickle of `f` names no storage `key` (the source's own index is wrong).
  Status check(TorchFile& f, const std::string& key);

 private:
  std::mutex mu_;
  std::map<std::pair<std::string, size_t>, Status> done_;
};

}  // namespace ckpt::torch
