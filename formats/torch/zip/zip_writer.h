// A streaming writer of stored (uncompressed) zip archives in the layout torch.save's
// PyTorchStreamWriter (caffe2/serialize/inline_container.cc) gives them, for files that PyTorch
// reads (torch.save zips, DCP items):
//  - every entry's data starts at a multiple of `alignment` (64, torch's kFieldAlignment) from
//    the zip's first byte: the local header's extra field ends with torch's padding record
//    (id "FB", then that many 'Z' bytes);
//  - ZIP64 (extra field 0x0001, ZIP64 end of central directory record and locator) for an entry
//    of 4 GiB or more, an offset past 4 GiB, 65535 entries or more, or always when forced (tests);
//  - general purpose flag 0x0800 (UTF-8 names), method 0 (stored), DOS date 1980-01-01 00:00,
//    CRC-32 (zlib's crc32) computed incrementally as the data arrives;
//  - after every non-empty entry a data descriptor (flag 0x0008; 16 bytes, 24 when the entry or
//    its header offset passes 4 GiB) as miniz writes it: torch.load's storage offset calculation
//    (torch.utils.serialization.config.load.calculate_storage_offsets, meta/fake loads) counts
//    those bytes, and an entry whose header lies past 4 GiB carries that offset in its local
//    ZIP64 extra field, as miniz's does. CRC and sizes are in the local header as well.
// Sizes are declared up front (layout()), so every entry's place is known before any byte is
// written: entries are filled by pwrite in any interleaving, straight from memory or from a file
// range, either in order (write) or as disjoint byte ranges in any order (write_at: each range's
// CRC runs as its bytes pass, contiguous ranges are merged with zlib's crc32_combine), and
// finish() checks every entry is covered exactly once, then writes the local headers in front of
// the data and the central directory after it. Memory: O(entries + ranges not yet merged),
// never the data. The zip may start at any byte of a file it does not own (attach(out, base)): a DCP .distcp
// holds one zip per item.
// Why not libzip (which reads these files, formats/torch/torch_file.h): libzip builds an archive
// from zip_source callbacks at zip_close and offers no way to learn an entry's data offset or to
// fill a multi-GB entry in slabs from our TensorSink in an order of our choosing; torch's own
// alignment padding is not expressible either.
// Thread safety: one thread at a time.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "formats/base/status.h"
#include "formats/io/output_file.h"

namespace ckpt::torch {

struct ZipEntrySpec {
  std::string name;   // path inside the archive (UTF-8, '/' separated)
  uint64_t size = 0;  // bytes of data
};

struct ZipWriterOptions {
  uint64_t alignment = 64;   // data offsets are multiples of this (1: none); at most 4096
  bool force_zip64 = false;  // ZIP64 records even when nothing needs them
};

class ZipWriter {
 public:
  explicit ZipWriter(ZipWriterOptions opts = {}) : opts_(opts) {}

  // Plans the archive (no I/O). Names must be non-empty, unique and < 64 KiB.
  Status layout(std::vector<ZipEntrySpec> entries);
  uint64_t total_size() const { return total_; }           // bytes of the whole zip
  size_t entry_count() const { return entries_.size(); }
  uint64_t data_offset(size_t entry) const { return entries_[entry].data; }  // from the zip's start
  bool zip64() const { return zip64_; }

  // Where the bytes go: `out` (not owned) with the zip's first byte at `base`; entries' data as
  // `out` writes (buffered, or O_DIRECT and a write pool: formats/io/output_file.h; the caller waits
  // for its writes before an fsync), the headers and directory through its buffered descriptor
  // (never a page written direct: those lie inside one entry's data). `what` names the file in errors.
  void attach(const OutputFile& out, uint64_t base, std::string what);
  // Appends `n` bytes to entry `entry` (after the last appended byte).
  Status write(size_t entry, const void* data, uint64_t n);
  // Writes `n` bytes at byte `offset` of entry `entry` (ranges must not overlap). An entry is
  // filled either by write() or by write_at(), not both.
  Status write_at(size_t entry, uint64_t offset, const void* data, uint64_t n);
  // write() / write_at() of bytes [src_off, src_off + n) of `src_fd` (copied file to file).
  Status write_from_file(size_t entry, int src_fd, uint64_t src_off, uint64_t n);
  Status write_from_file_at(size_t entry, uint64_t offset, int src_fd, uint64_t src_off, uint64_t n);
  // Every entry complete: writes the local headers, the central directory and the end records.
  Status finish();

 private:
  struct Entry {
    std::string name;
    uint64_t size = 0;
    uint64_t header = 0;   // local header offset
    uint64_t data = 0;     // data offset
    uint64_t appended = 0;  // write(): the next byte
    uint64_t written = 0;   // bytes written in all
    uint32_t crc = 0;       // of the whole entry, set by finish()
    std::map<uint64_t, std::pair<uint64_t, uint32_t>> runs;  // written ranges: begin -> (end, CRC)
    bool zip64 = false;    // sizes in the local header's ZIP64 extra field
    bool local_offset64 = false;  // the header offset too (miniz does so past 4 GiB)
    uint16_t padding = 0;  // 'Z' bytes of the FB record
    uint8_t descriptor = 0;  // bytes of the data descriptor after the data (0, 16, 24)
    uint64_t local_zip64_len() const { return (zip64 || local_offset64) ? 4 + (zip64 ? 16 : 0) + (local_offset64 ? 8 : 0) : 0; }
    uint16_t flags() const { return descriptor ? 0x0808 : 0x0800; }  // UTF-8 names [+ data descriptor]
  };
  ZipWriterOptions opts_;
  std::vector<Entry> entries_;
  uint64_t cd_offset_ = 0, cd_size_ = 0, total_ = 0;
  bool zip64_ = false, laid_out_ = false, finished_ = false;
  const OutputFile* out_ = nullptr;  // entries' data (buffered, direct, a write pool: as it was opened)
  int fd_ = -1;                       // out_'s buffered descriptor: headers, descriptors, directory
  uint64_t base_ = 0;
  std::string what_;

  Result<Entry*> check_range(size_t entry, uint64_t offset, uint64_t n);
  void add_run(Entry& e, uint64_t offset, uint64_t n, uint32_t crc);
  std::string local_header(const Entry& e) const;
  std::string central_directory() const;
};

// zlib's crc32 over any length (zlib takes 32-bit lengths).
uint32_t zip_crc32(uint32_t crc, const void* data, uint64_t n);

}  // namespace ckpt::torch
