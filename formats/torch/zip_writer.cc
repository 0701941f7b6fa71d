#include "formats/torch/zip_writer.h"

#include <zlib.h>

#include <set>

#include "formats/checked.h"
#include "formats/file_io.h"

namespace ckpt::torch {

namespace zip_writer_detail {

constexpr uint64_t kMax32 = 0xFFFFFFFFull;
constexpr uint64_t kLocalFixed = 30, kCentralFixed = 46, kEocd = 22, kZip64Eocd = 56, kZip64Locator = 20;
constexpr uint16_t kFlagUtf8 = 0x0800;
constexpr uint16_t kDosDate = (0 << 9) | (1 << 5) | 1;  // 1980-01-01

void le16(std::string& s, uint64_t v) {
  for (int b = 0; b < 2; ++b) s += static_cast<char>((v >> (8 * b)) & 0xFF);
}
void le32(std::string& s, uint64_t v) {
  for (int b = 0; b < 4; ++b) s += static_cast<char>((v >> (8 * b)) & 0xFF);
}
void le64(std::string& s, uint64_t v) {
  for (int b = 0; b < 8; ++b) s += static_cast<char>((v >> (8 * b)) & 0xFF);
}

// The central directory's ZIP64 fields of an entry: sizes when its local header has them (or
// forced), the header offset when past 4 GiB (or forced).
struct CentralZip64 {
  bool sizes = false, offset = false;
  uint64_t extra_len() const { return (sizes || offset) ? 4 + (sizes ? 16 : 0) + (offset ? 8 : 0) : 0; }
};

}  // namespace zip_writer_detail


uint32_t zip_crc32(uint32_t crc, const void* data, uint64_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {
    uInt k = static_cast<uInt>(std::min<uint64_t>(n, 1u << 30));
    crc = static_cast<uint32_t>(::crc32(crc, p, k));
    p += k;
    n -= k;
  }
  return crc;
}

Status ZipWriter::layout(std::vector<ZipEntrySpec> entries) {
  if (laid_out_) return Status::Internal("ZipWriter::layout called twice");
  if (opts_.alignment == 0 || opts_.alignment > 4096)
    return Status::InvalidArgument("zip alignment " + std::to_string(opts_.alignment) + " (expected 1..4096)");
  std::set<std::string> names;
  uint64_t cursor = 0;
  bool big = opts_.force_zip64 || entries.size() >= 0xFFFF;
  for (auto& spec : entries) {
    if (spec.name.empty() || spec.name.size() >= 0xFFFF || !names.insert(spec.name).second)
      return Status::InvalidArgument("zip entry name '" + spec.name + "' is empty, too long or given twice");
    Entry e;
    e.name = std::move(spec.name);
    e.size = spec.size;
    e.header = cursor;
    e.zip64 = opts_.force_zip64 || e.size >= zip_writer_detail::kMax32;
    uint64_t start = cursor + zip_writer_detail::kLocalFixed + e.name.size() + (e.zip64 ? 20 : 0) + 4;  // + FB record header
    e.padding = static_cast<uint16_t>((opts_.alignment - start % opts_.alignment) % opts_.alignment);
    e.data = start + e.padding;
    auto end = checked_add(e.data, e.size);
    if (!end) return Status::InvalidArgument("zip entry '" + e.name + "' of " + std::to_string(e.size) + " bytes overflows");
    cursor = *end;
    big = big || e.zip64 || e.header >= zip_writer_detail::kMax32;
    entries_.push_back(std::move(e));
  }
  cd_offset_ = cursor;
  cd_size_ = 0;
  for (const auto& e : entries_) {
    zip_writer_detail::CentralZip64 z{e.zip64, opts_.force_zip64 || e.header >= zip_writer_detail::kMax32};
    cd_size_ += zip_writer_detail::kCentralFixed + e.name.size() + z.extra_len();
  }
  zip64_ = big || cd_offset_ >= zip_writer_detail::kMax32 || cd_size_ >= zip_writer_detail::kMax32;
  total_ = cd_offset_ + cd_size_ + (zip64_ ? zip_writer_detail::kZip64Eocd + zip_writer_detail::kZip64Locator : 0) + zip_writer_detail::kEocd;
  laid_out_ = true;
  return Status::Ok();
}

void ZipWriter::attach(int fd, uint64_t base, std::string what) {
  fd_ = fd;
  base_ = base;
  what_ = std::move(what);
}

Result<ZipWriter::Entry*> ZipWriter::next_run(size_t entry, uint64_t n) {
  if (!laid_out_ || fd_ < 0 || finished_) return Status::Internal("ZipWriter::write outside layout/attach..finish").with_file(what_);
  if (entry >= entries_.size()) return Status::Internal("ZipWriter::write: entry " + std::to_string(entry) + " out of range").with_file(what_);
  Entry& e = entries_[entry];
  if (n > e.size - e.written)
    return Status::Internal("write of " + std::to_string(n) + " bytes overruns zip entry '" + e.name + "' (" +
                            std::to_string(e.size - e.written) + " left)").with_file(what_);
  return &e;
}

Status ZipWriter::write(size_t entry, const void* data, uint64_t n) {
  CKPT_ASSIGN_OR_RETURN(Entry * e, next_run(entry, n));
  CKPT_RETURN_IF_ERROR(pwrite_full(fd_, data, n, base_ + e->data + e->written, what_));
  e->crc = zip_crc32(e->crc, data, n);
  e->written += n;
  return Status::Ok();
}

Status ZipWriter::write_from_file(size_t entry, int src_fd, uint64_t src_off, uint64_t n) {
  CKPT_ASSIGN_OR_RETURN(Entry * e, next_run(entry, n));
  uint32_t crc = e->crc;
  CKPT_RETURN_IF_ERROR(copy_file_bytes(src_fd, src_off, fd_, base_ + e->data + e->written, n, what_,
                                       [&crc](const void* p, size_t k) { crc = zip_crc32(crc, p, k); }));
  e->crc = crc;
  e->written += n;
  return Status::Ok();
}

std::string ZipWriter::local_header(const Entry& e) const {
  std::string h;
  zip_writer_detail::le32(h, 0x04034b50);
  zip_writer_detail::le16(h, e.zip64 ? 45 : 20);  // version needed
  zip_writer_detail::le16(h, zip_writer_detail::kFlagUtf8);
  zip_writer_detail::le16(h, 0);  // stored
  zip_writer_detail::le16(h, 0);  // time
  zip_writer_detail::le16(h, zip_writer_detail::kDosDate);
  zip_writer_detail::le32(h, e.crc);
  zip_writer_detail::le32(h, e.zip64 ? zip_writer_detail::kMax32 : e.size);
  zip_writer_detail::le32(h, e.zip64 ? zip_writer_detail::kMax32 : e.size);
  zip_writer_detail::le16(h, e.name.size());
  zip_writer_detail::le16(h, (e.zip64 ? 20 : 0) + 4 + e.padding);
  h += e.name;
  if (e.zip64) {
    zip_writer_detail::le16(h, 0x0001);
    zip_writer_detail::le16(h, 16);
    zip_writer_detail::le64(h, e.size);
    zip_writer_detail::le64(h, e.size);
  }
  h += "FB";
  zip_writer_detail::le16(h, e.padding);
  h.append(e.padding, 'Z');
  return h;
}

std::string ZipWriter::central_directory() const {
  std::string d;
  for (const auto& e : entries_) {
    zip_writer_detail::CentralZip64 z{e.zip64, opts_.force_zip64 || e.header >= zip_writer_detail::kMax32};
    zip_writer_detail::le32(d, 0x02014b50);
    zip_writer_detail::le16(d, (3 << 8) | (zip64_ ? 45 : 20));  // made by: Unix
    zip_writer_detail::le16(d, e.zip64 || z.offset ? 45 : 20);
    zip_writer_detail::le16(d, zip_writer_detail::kFlagUtf8);
    zip_writer_detail::le16(d, 0);
    zip_writer_detail::le16(d, 0);
    zip_writer_detail::le16(d, zip_writer_detail::kDosDate);
    zip_writer_detail::le32(d, e.crc);
    zip_writer_detail::le32(d, z.sizes ? zip_writer_detail::kMax32 : e.size);
    zip_writer_detail::le32(d, z.sizes ? zip_writer_detail::kMax32 : e.size);
    zip_writer_detail::le16(d, e.name.size());
    zip_writer_detail::le16(d, z.extra_len());
    zip_writer_detail::le16(d, 0);  // comment
    zip_writer_detail::le16(d, 0);  // disk
    zip_writer_detail::le16(d, 0);  // internal attributes
    zip_writer_detail::le32(d, 0100644u << 16);  // external attributes: a regular file, rw-r--r--
    zip_writer_detail::le32(d, z.offset ? zip_writer_detail::kMax32 : e.header);
    d += e.name;
    if (z.extra_len() > 0) {
      zip_writer_detail::le16(d, 0x0001);
      zip_writer_detail::le16(d, z.extra_len() - 4);
      if (z.sizes) {
        zip_writer_detail::le64(d, e.size);
        zip_writer_detail::le64(d, e.size);
      }
      if (z.offset) zip_writer_detail::le64(d, e.header);
    }
  }
  uint64_t n = entries_.size();
  if (zip64_) {
    zip_writer_detail::le32(d, 0x06064b50);
    zip_writer_detail::le64(d, zip_writer_detail::kZip64Eocd - 12);
    zip_writer_detail::le16(d, (3 << 8) | 45);
    zip_writer_detail::le16(d, 45);
    zip_writer_detail::le32(d, 0);
    zip_writer_detail::le32(d, 0);
    zip_writer_detail::le64(d, n);
    zip_writer_detail::le64(d, n);
    zip_writer_detail::le64(d, cd_size_);
    zip_writer_detail::le64(d, cd_offset_);
    zip_writer_detail::le32(d, 0x07064b50);
    zip_writer_detail::le32(d, 0);
    zip_writer_detail::le64(d, cd_offset_ + cd_size_);
    zip_writer_detail::le32(d, 1);
  }
  bool f = opts_.force_zip64;
  zip_writer_detail::le32(d, 0x06054b50);
  zip_writer_detail::le16(d, 0);
  zip_writer_detail::le16(d, 0);
  zip_writer_detail::le16(d, f || n >= 0xFFFF ? 0xFFFF : n);
  zip_writer_detail::le16(d, f || n >= 0xFFFF ? 0xFFFF : n);
  zip_writer_detail::le32(d, f || cd_size_ >= zip_writer_detail::kMax32 ? zip_writer_detail::kMax32 : cd_size_);
  zip_writer_detail::le32(d, f || cd_offset_ >= zip_writer_detail::kMax32 ? zip_writer_detail::kMax32 : cd_offset_);
  zip_writer_detail::le16(d, 0);
  return d;
}

Status ZipWriter::finish() {
  if (!laid_out_ || fd_ < 0 || finished_) return Status::Internal("ZipWriter::finish outside layout/attach").with_file(what_);
  for (const auto& e : entries_)
    if (e.written != e.size)
      return Status::Internal("zip entry '" + e.name + "' incomplete: " + std::to_string(e.written) + " of " +
                              std::to_string(e.size) + " bytes written").with_file(what_);
  for (const auto& e : entries_) {
    std::string h = local_header(e);
    if (e.header + h.size() != e.data) return Status::Internal("zip local header of '" + e.name + "' does not fit its layout");
    CKPT_RETURN_IF_ERROR(pwrite_full(fd_, h.data(), h.size(), base_ + e.header, what_));
  }
  std::string d = central_directory();
  if (cd_offset_ + d.size() != total_) return Status::Internal("zip central directory does not fit its layout");
  CKPT_RETURN_IF_ERROR(pwrite_full(fd_, d.data(), d.size(), base_ + cd_offset_, what_));
  finished_ = true;
  return Status::Ok();
}

}  // namespace ckpt::torch
