// A read-only zip archive (ZIP64 included) through libzip, optionally lying at a byte range of a
// larger file (DCP .distcp items). Entries are read in place: stored entries by seeking, deflated
// ones by inflating forward only as far as a read needs (one open stream is kept for sequential
// reads). Entries other than stored / deflated, and encrypted ones, are refused.
// A stored entry's data is found in the file (stored_data_offset: the central directory's local
// header offset, ZIP64 included, and the local header checked against the entry), so its bytes
// are read with pread and can be copied file to file; whenever that lookup does not check out,
// libzip's reads are used instead.
// check_crc recomputes an entry's CRC-32 (zlib) over its uncompressed bytes, streamed in bounded
// chunks, and compares it with the central directory's and the local record's (the local header,
// or the data descriptor when general purpose bit 3 is set, as torch.save writes).
// Thread safety: one thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "formats/base/fs_util.h"
#include "formats/base/status.h"

struct zip;       // libzip's zip_t
struct zip_file;  // libzip's zip_file_t

namespace ckpt::torch {

class ZipArchive {
 public:
  struct Entry {
    uint64_t index = 0;
    std::string name;
    uint64_t size = 0;       // uncompressed bytes (as the central directory declares)
    uint64_t comp_size = 0;
    bool deflated = false;
    uint32_t crc = 0;        // CRC-32 of the uncompressed bytes, as the central directory declares
  };

  // `length` UINT64_MAX: to the end of the file. Errors: TorchNotZip, TorchZipCorrupt, Io.
  static Result<std::unique_ptr<ZipArchive>> open(const std::string& path, uint64_t offset, uint64_t length);
  ~ZipArchive();
  ZipArchive(const ZipArchive&) = delete;
  ZipArchive& operator=(const ZipArchive&) = delete;

  uint64_t num_entries() const;
  // Entry `i` (TorchZipMethod when neither stored nor deflated, or encrypted).
  Result<Entry> entry(uint64_t i) const;
  // The entry named exactly `name`, or nullopt.
  Result<std::optional<Entry>> find(const std::string& name) const;
  // Reads [offset, offset + bytes) of `e` (the caller checks the range against e.size).
  Status read(const Entry& e, uint64_t offset, uint64_t bytes, void* dst);
  // The whole entry, refused (`too_large_code`) when it declares more than `max_bytes`.
  Result<std::string> read_all(const Entry& e, uint64_t max_bytes, const char* too_large_code);
  // Recomputes `e`'s CRC-32 (chunks of at most 4 MiB; `on_bytes(n)` after each) and compares it
  // with the central directory's and the local record's. ZipCrcMismatch names the file, the entry
  // and both values; TorchZipCorrupt when the entry cannot be read or inflated.
  Status check_crc(const Entry& e, const std::function<void(uint64_t)>& on_bytes = nullptr);
  const std::string& path() const { return path_; }
  uint64_t base() const { return base_; }
  // The byte offset in path() (the archive's own offset included) where stored entry `e`'s
  // e.size bytes lie as they are; nullopt for a deflated entry, or when the central directory
  // or the local header does not check out (read() still works then).
  std::optional<uint64_t> stored_data_offset(const Entry& e);
  // A descriptor of path() opened for reading (owned; valid while the archive lives), or -1.
  int data_fd();

 private:
  ZipArchive() = default;
  Status zip_error(const std::string& what) const;
  void close_stream();
  bool index_local_headers();  // zip_data_offset.cc: fills local_headers_ from the central directory
  // zip_data_offset.cc: the CRC-32 the local record of `e` declares (local header, or the data
  // descriptor when bit 3 is set); nullopt when it cannot be located.
  std::optional<uint32_t> local_crc(const Entry& e);

  std::string path_;
  uint64_t base_ = 0;                // the archive's first byte in path_
  uint64_t length_ = UINT64_MAX;     // its length (UINT64_MAX: to the end of the file)
  ScopedFd fd_;                      // opened on first use of stored_data_offset
  int index_state_ = 0;              // 0 not built, 1 built, -1 unusable
  std::unordered_map<std::string, uint64_t> local_headers_;  // entry name -> local header offset
  std::unordered_map<uint64_t, std::optional<uint64_t>> data_offsets_;  // entry index -> data offset
  ::zip* za_ = nullptr;
  // The deflated entry read last, positioned at stream_pos_ (sequential reads do not restart).
  ::zip_file* stream_ = nullptr;
  uint64_t stream_index_ = 0;
  uint64_t stream_pos_ = 0;
};

}  // namespace ckpt::torch
