// Writers of torch.save files (the zip format torch.load reads, weights_only=True included):
//   <archive>/data.pkl                 the pickle of the root object (formats/torch/pickle/pickler.h)
//   <archive>/.format_version          "1"   (storages in the order of their keys, as torch 2.x)
//   <archive>/.storage_alignment       "64"
//   <archive>/byteorder                "little"
//   <archive>/data/<key>               each storage's bytes (little-endian, dense)
//   <archive>/version                  "3\n"
//   <archive>/.data/serialization_id   40 decimal digits
// in that order (torch.serialization._save + PyTorchStreamWriter), each record's data 64-byte
// aligned (formats/torch/zip/zip_writer.h). The pickle is made at plan time from a PyObj tree whose
// kTensor / kStorage objects name storages by key; every storage named there must be declared
// (same dtype and numel) and every tensor must lie inside its storage. Storage bytes then arrive
// in slabs (each storage's bytes in order, or disjoint byte ranges in any order with write_at;
// storages in any interleaving), are pwritten in place and never held: memory is the pickle plus
// O(storages). TorchFileSink (torch_file_sink.h) puts a TensorSink in front of it.
// TorchZipWriter writes one archive into a byte range of a file it does not own (DCP items);
// TorchFileWriter owns a file: `<path>.tmp-<pid>`, fsync, rename at commit; abort (or destruction
// before commit) removes the temp file.
// Thread safety: one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "formats/base/fs_util.h"
#include "formats/base/status.h"
#include "formats/tensor/tensor_io.h"
#include "formats/torch/pickle/py_object.h"
#include "formats/torch/zip/zip_writer.h"

namespace ckpt::torch {

struct TorchStorage {
  std::string key;   // data/<key>; torch uses "0", "1", ... in order of first use
  DType dtype = DType::kF32;
  int64_t numel = 0;
};

struct TorchWriteOptions {
  // The archive's top folder. Empty: the file name without its extension (as torch.save names
  // it), "archive" for an embedded zip (as torch.save to a stream, and DCP, name it).
  std::string archive_name;
  bool force_zip64 = false;        // ZIP64 records whatever the size (tests)
  bool fsync = true;               // TorchFileWriter: fsync before the rename
  std::string serialization_id;    // empty: 40 random digits
  IoMode io = IoMode::kAuto;       // TorchFileWriter: how storage bytes are written (formats/io/output_file.h)
  WritePool* write_pool = nullptr;  // TorchFileWriter: its direct writes staged there, several in flight; not owned
};

class TorchZipWriter {
 public:
  // Pickles `root`, checks it against `storages` and lays out the archive (no I/O).
  static Result<std::unique_ptr<TorchZipWriter>> plan(const PyObj* root, std::vector<TorchStorage> storages,
                                                      const TorchWriteOptions& opts);
  uint64_t size() const { return zip_.total_size(); }  // bytes of the whole archive
  const std::vector<TorchStorage>& storages() const { return storages_; }
  uint64_t storage_bytes(size_t storage) const;
  // Absolute offset in the file (after attach) of a storage's first byte.
  uint64_t storage_offset(size_t storage) const { return base_ + zip_.data_offset(first_storage_entry_ + storage); }
  const std::string& pickle() const { return pickle_; }

  // The archive goes to `out` (not owned) at byte `base` (ZipWriter::attach); `what` names the file in errors.
  void attach(const OutputFile& out, uint64_t base, std::string what);
  // The next `bytes` bytes of storage `storage` (index in storages()).
  Status write(size_t storage, const void* data, uint64_t bytes);
  Status write_from_file(size_t storage, int src_fd, uint64_t src_off, uint64_t bytes);
  // `bytes` bytes at byte `offset` of storage `storage` (disjoint ranges, any order; a storage is
  // filled either by write() or by write_at()).
  Status write_at(size_t storage, uint64_t offset, const void* data, uint64_t bytes);
  Status write_from_file_at(size_t storage, uint64_t offset, int src_fd, uint64_t src_off, uint64_t bytes);
  // All storages complete: writes the small records, local headers and central directory.
  Status finish();

 private:
  TorchZipWriter() = default;
  ZipWriter zip_;
  std::vector<TorchStorage> storages_;
  std::vector<std::string> small_;  // contents of the non-storage entries, by entry index (storages: "")
  std::string pickle_;
  size_t first_storage_entry_ = 0;
  uint64_t base_ = 0;
};

class TorchFileWriter {
 public:
  explicit TorchFileWriter(std::string path, TorchWriteOptions opts = {});
  ~TorchFileWriter();
  TorchFileWriter(const TorchFileWriter&) = delete;
  TorchFileWriter& operator=(const TorchFileWriter&) = delete;

  // Plans the archive (TorchZipWriter::plan), creates the temp file at its full size.
  Status begin(const PyObj* root, std::vector<TorchStorage> storages);
  Status write(size_t storage, const void* data, uint64_t bytes);
  Status write_from_file(size_t storage, int src_fd, uint64_t src_off, uint64_t bytes);
  Status write_at(size_t storage, uint64_t offset, const void* data, uint64_t bytes);
  Status write_from_file_at(size_t storage, uint64_t offset, int src_fd, uint64_t src_off, uint64_t bytes);
  const TorchZipWriter* zip() const { return zip_.get(); }  // after begin()
  Status commit();  // finish, fsync, rename to the final path
  void abort();     // removes the temp file
  uint64_t file_size() const { return zip_ ? zip_->size() : 0; }
  const std::string& path() const { return path_; }

 private:
  std::string path_, tmp_;
  TorchWriteOptions opts_;
  OutputFile out_;
  std::unique_ptr<TorchZipWriter> zip_;
  bool committed_ = false;
};

// A whole torch.save file of `root` with storages given in memory (tests, small side files
// such as Megatron's common state): data[i] holds storages[i]'s bytes.
Status write_torch_file(const std::string& path, const PyObj* root, const std::vector<TorchStorage>& storages,
                        const std::vector<const void*>& data, const TorchWriteOptions& opts = {});

}  // namespace ckpt::torch
