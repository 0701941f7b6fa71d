#include "formats/torch/zip/zip_writer.h"

#include <zlib.h>

#include <iterator>
#include <set>

#include "formats/base/checked.h"
#include "formats/base/file_io.h"

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
  using namespace zip_writer_detail;  // block scope: unity-safe
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
    e.zip64 = opts_.force_zip64 || e.size >= kMax32;
    e.local_offset64 = e.header >= kMax32;
    uint64_t start = cursor + kLocalFixed + e.name.size() + e.local_zip64_len() + 4;  // + FB record header
    e.padding = static_cast<uint16_t>((opts_.alignment - start % opts_.alignment) % opts_.alignment);
    e.data = start + e.padding;
    e.descriptor = e.size == 0 ? 0 : (e.header >= kMax32 || e.size >= kMax32) ? 24 : 16;
    auto end = checked_add(e.data, e.size + e.descriptor);
    if (!end) return Status::InvalidArgument("zip entry '" + e.name + "' of " + std::to_string(e.size) + " bytes overflows");
    cursor = *end;
    big = big || e.zip64 || e.header >= kMax32;
    entries_.push_back(std::move(e));
  }
  cd_offset_ = cursor;
  cd_size_ = 0;
  for (const auto& e : entries_) {
    CentralZip64 z{e.zip64, opts_.force_zip64 || e.header >= kMax32};
    cd_size_ += kCentralFixed + e.name.size() + z.extra_len();
  }
  zip64_ = big || cd_offset_ >= kMax32 || cd_size_ >= kMax32;
  total_ = cd_offset_ + cd_size_ + (zip64_ ? kZip64Eocd + kZip64Locator : 0) + kEocd;
  laid_out_ = true;
  return Status::Ok();
}

void ZipWriter::attach(const OutputFile& out, uint64_t base, std::string what) {
  out_ = &out;
  fd_ = out.fd();
  base_ = base;
  what_ = std::move(what);
}

Result<ZipWriter::Entry*> ZipWriter::check_range(size_t entry, uint64_t offset, uint64_t n) {
  if (!laid_out_ || fd_ < 0 || finished_) return Status::Internal("ZipWriter::write outside layout/attach..finish").with_file(what_);
  if (entry >= entries_.size()) return Status::Internal("ZipWriter::write: entry " + std::to_string(entry) + " out of range").with_file(what_);
  Entry& e = entries_[entry];
  auto end = checked_add(offset, n);
  bool overlap = false;
  if (end && n > 0) {
    auto next = e.runs.lower_bound(offset + 1);  // first run starting after `offset`
    if (next != e.runs.end() && next->first < *end) overlap = true;
    if (next != e.runs.begin() && std::prev(next)->second.first > offset) overlap = true;
  }
  if (!end || *end > e.size || overlap)
    return Status::Internal("write of " + std::to_string(n) + " bytes at " + std::to_string(offset) + " overruns zip entry '" + e.name +
                            "' (" + std::to_string(e.size) + " bytes) or overlaps bytes already written").with_file(what_);
  return &e;
}

void ZipWriter::add_run(Entry& e, uint64_t offset, uint64_t n, uint32_t crc) {
  if (n == 0) return;
  e.written += n;
  auto next = e.runs.lower_bound(offset);
  if (next != e.runs.begin() && std::prev(next)->second.first == offset) {  // extends the run before
    auto prev = std::prev(next);
    prev->second = {offset + n, static_cast<uint32_t>(::crc32_combine(prev->second.second, crc, static_cast<z_off_t>(n)))};
    next = prev;
  } else {
    next = e.runs.emplace(offset, std::make_pair(offset + n, crc)).first;
  }
  auto after = std::next(next);
  if (after != e.runs.end() && after->first == next->second.first) {  // joins the run after
    uint64_t len = after->second.first - after->first;
    next->second = {after->second.first, static_cast<uint32_t>(::crc32_combine(next->second.second, after->second.second,
                                                                                 static_cast<z_off_t>(len)))};
    e.runs.erase(after);
  }
}

Status ZipWriter::write(size_t entry, const void* data, uint64_t n) {
  uint64_t at = entry < entries_.size() ? entries_[entry].appended : 0;
  CKPT_RETURN_IF_ERROR(write_at(entry, at, data, n));
  entries_[entry].appended += n;
  return Status::Ok();
}

Status ZipWriter::write_at(size_t entry, uint64_t offset, const void* data, uint64_t n) {
  CKPT_ASSIGN_OR_RETURN(Entry * e, check_range(entry, offset, n));
  const uint32_t crc = zip_crc32(0, data, n);  // before the write: with a pool, `data` is copied, not kept
  CKPT_RETURN_IF_ERROR(out_->write(data, n, base_ + e->data + offset));
  add_run(*e, offset, n, crc);
  return Status::Ok();
}

Status ZipWriter::write_from_file(size_t entry, int src_fd, uint64_t src_off, uint64_t n) {
  uint64_t at = entry < entries_.size() ? entries_[entry].appended : 0;
  CKPT_RETURN_IF_ERROR(write_from_file_at(entry, at, src_fd, src_off, n));
  entries_[entry].appended += n;
  return Status::Ok();
}

Status ZipWriter::write_from_file_at(size_t entry, uint64_t offset, int src_fd, uint64_t src_off, uint64_t n) {
  CKPT_ASSIGN_OR_RETURN(Entry * e, check_range(entry, offset, n));
  uint32_t crc = 0;
  CKPT_RETURN_IF_ERROR(out_->copy_runs({FileExtent{src_fd, src_off, n}}, base_ + e->data + offset,
                                       [&crc](const void* p, size_t k) { crc = zip_crc32(crc, p, k); }));
  add_run(*e, offset, n, crc);
  return Status::Ok();
}

std::string ZipWriter::local_header(const Entry& e) const {
  using namespace zip_writer_detail;  // block scope: unity-safe
  std::string h;
  le32(h, 0x04034b50);
  le16(h, e.local_zip64_len() ? 45 : 20);  // version needed
  le16(h, e.flags());
  le16(h, 0);  // stored
  le16(h, 0);  // time
  le16(h, kDosDate);
  le32(h, e.crc);
  le32(h, e.zip64 ? kMax32 : e.size);
  le32(h, e.zip64 ? kMax32 : e.size);
  le16(h, e.name.size());
  le16(h, e.local_zip64_len() + 4 + e.padding);
  h += e.name;
  if (e.local_zip64_len()) {
    le16(h, 0x0001);
    le16(h, e.local_zip64_len() - 4);
    if (e.zip64) {
      le64(h, e.size);
      le64(h, e.size);
    }
    if (e.local_offset64) le64(h, e.header);
  }
  h += "FB";
  le16(h, e.padding);
  h.append(e.padding, 'Z');
  return h;
}

std::string ZipWriter::central_directory() const {
  using namespace zip_writer_detail;  // block scope: unity-safe
  std::string d;
  for (const auto& e : entries_) {
    CentralZip64 z{e.zip64, opts_.force_zip64 || e.header >= kMax32};
    le32(d, 0x02014b50);
    le16(d, (3 << 8) | (zip64_ ? 45 : 20));  // made by: Unix
    le16(d, e.zip64 || z.offset ? 45 : 20);
    le16(d, e.flags());
    le16(d, 0);
    le16(d, 0);
    le16(d, kDosDate);
    le32(d, e.crc);
    le32(d, z.sizes ? kMax32 : e.size);
    le32(d, z.sizes ? kMax32 : e.size);
    le16(d, e.name.size());
    le16(d, z.extra_len());
    le16(d, 0);  // comment
    le16(d, 0);  // disk
    le16(d, 0);  // internal attributes
    le32(d, 0100644u << 16);  // external attributes: a regular file, rw-r--r--
    le32(d, z.offset ? kMax32 : e.header);
    d += e.name;
    if (z.extra_len() > 0) {
      le16(d, 0x0001);
      le16(d, z.extra_len() - 4);
      if (z.sizes) {
        le64(d, e.size);
        le64(d, e.size);
      }
      if (z.offset) le64(d, e.header);
    }
  }
  uint64_t n = entries_.size();
  if (zip64_) {
    le32(d, 0x06064b50);
    le64(d, kZip64Eocd - 12);
    le16(d, (3 << 8) | 45);
    le16(d, 45);
    le32(d, 0);
    le32(d, 0);
    le64(d, n);
    le64(d, n);
    le64(d, cd_size_);
    le64(d, cd_offset_);
    le32(d, 0x07064b50);
    le32(d, 0);
    le64(d, cd_offset_ + cd_size_);
    le32(d, 1);
  }
  bool f = opts_.force_zip64;
  le32(d, 0x06054b50);
  le16(d, 0);
  le16(d, 0);
  le16(d, f || n >= 0xFFFF ? 0xFFFF : n);
  le16(d, f || n >= 0xFFFF ? 0xFFFF : n);
  le32(d, f || cd_size_ >= kMax32 ? kMax32 : cd_size_);
  le32(d, f || cd_offset_ >= kMax32 ? kMax32 : cd_offset_);
  le16(d, 0);
  return d;
}

Status ZipWriter::finish() {
  if (!laid_out_ || fd_ < 0 || finished_) return Status::Internal("ZipWriter::finish outside layout/attach").with_file(what_);
  for (auto& e : entries_) {
    if (e.written != e.size || e.runs.size() > 1)
      return Status::Internal("zip entry '" + e.name + "' incomplete: " + std::to_string(e.written) + " of " +
                              std::to_string(e.size) + " bytes written").with_file(what_);
    e.crc = e.runs.empty() ? 0 : e.runs.begin()->second.second;
  }
  for (const auto& e : entries_) {
    std::string h = local_header(e);
    if (e.header + h.size() != e.data) return Status::Internal("zip local header of '" + e.name + "' does not fit its layout");
    CKPT_RETURN_IF_ERROR(pwrite_full(fd_, h.data(), h.size(), base_ + e.header, what_));
    if (e.descriptor > 0) {  // miniz's data descriptor, which torch's storage offset calculation counts
      std::string dd;
      zip_writer_detail::le32(dd, 0x08074b50);
      zip_writer_detail::le32(dd, e.crc);
      for (int k = 0; k < 2; ++k) (e.descriptor == 24 ? zip_writer_detail::le64 : zip_writer_detail::le32)(dd, e.size);
      CKPT_RETURN_IF_ERROR(pwrite_full(fd_, dd.data(), dd.size(), base_ + e.data + e.size, what_));
    }
  }
  std::string d = central_directory();
  if (cd_offset_ + d.size() != total_) return Status::Internal("zip central directory does not fit its layout");
  CKPT_RETURN_IF_ERROR(pwrite_full(fd_, d.data(), d.size(), base_ + cd_offset_, what_));
  finished_ = true;
  return Status::Ok();
}

}  // namespace ckpt::torch
