// ZipArchive::stored_data_offset: where a stored entry's bytes lie in the file. libzip reads
// entries but does not say where their data starts, so the central directory is read here for the
// local header offsets (APPNOTE 4.3.12-4.3.16: end of central directory record, ZIP64 locator and
// record, central file headers with their ZIP64 extra field 0x0001), and an entry's local header
// is checked (signature, method 0, the same name) before its data offset is trusted. Every size
// is bounded by the archive's length; any mismatch gives nullopt and the caller reads through
// libzip (which has already checked the archive's consistency at open).
#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "formats/base/file_io.h"
#include "formats/torch/zip/zip_archive.h"

namespace ckpt::torch {

namespace zip_offset_detail {

constexpr uint32_t kEocdSig = 0x06054b50, kZip64LocSig = 0x07064b50, kZip64EocdSig = 0x06064b50;
constexpr uint32_t kCentralSig = 0x02014b50, kLocalSig = 0x04034b50;
constexpr uint64_t kEocdSize = 22, kZip64LocSize = 20, kZip64EocdSize = 56, kCentralSize = 46, kLocalSize = 30;
constexpr uint64_t kMaxCentralDirBytes = 256ull << 20;  // larger directories: read through libzip

uint64_t zipoff_le(const unsigned char* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Reads `n` bytes at `off` of the archive (bounds checked against `len`).
bool zipoff_read(int fd, uint64_t base, uint64_t len, uint64_t off, uint64_t n, std::vector<unsigned char>& out) {
  if (off > len || n > len - off) return false;
  out.resize(n);
  return n == 0 || pread_full(fd, out.data(), n, base + off, "zip").ok();
}

// The central directory's offset and size (ZIP64 record when the 32-bit fields are saturated).
bool zipoff_central_dir(int fd, uint64_t base, uint64_t len, uint64_t& cd_off, uint64_t& cd_size) {
  const uint64_t tail = std::min<uint64_t>(len, kEocdSize + 0xffff + kZip64LocSize);
  std::vector<unsigned char> t;
  if (tail < kEocdSize || !zipoff_read(fd, base, len, len - tail, tail, t)) return false;
  for (uint64_t i = tail - kEocdSize + 1; i-- > 0;) {
    const unsigned char* e = t.data() + i;
    if (zipoff_le(e, 4) != kEocdSig || zipoff_le(e + 20, 2) != tail - i - kEocdSize) continue;
    cd_size = zipoff_le(e + 12, 4);
    cd_off = zipoff_le(e + 16, 4);
    if (cd_size == 0xffffffff || cd_off == 0xffffffff || zipoff_le(e + 10, 2) == 0xffff) {
      if (i < kZip64LocSize || zipoff_le(e - kZip64LocSize, 4) != kZip64LocSig) return false;
      std::vector<unsigned char> r;
      if (!zipoff_read(fd, base, len, zipoff_le(e - kZip64LocSize + 8, 8), kZip64EocdSize, r) || zipoff_le(r.data(), 4) != kZip64EocdSig)
        return false;
      cd_size = zipoff_le(r.data() + 40, 8);
      cd_off = zipoff_le(r.data() + 48, 8);
    }
    return cd_off <= len && cd_size <= len - cd_off;
  }
  return false;
}

// The local header offset of the central file header at `h` (ZIP64 extra field when saturated).
bool zipoff_local_offset(const unsigned char* h, const unsigned char* extra, uint64_t extra_len, uint64_t& lho) {
  lho = zipoff_le(h + 42, 4);
  if (lho != 0xffffffff) return true;
  for (uint64_t at = 0; at + 4 <= extra_len;) {
    const uint64_t id = zipoff_le(extra + at, 2), n = zipoff_le(extra + at + 2, 2);
    if (at + 4 + n > extra_len) return false;
    if (id == 0x0001) {
      uint64_t skip = (zipoff_le(h + 24, 4) == 0xffffffff ? 8 : 0) + (zipoff_le(h + 20, 4) == 0xffffffff ? 8 : 0);
      if (skip + 8 > n) return false;
      lho = zipoff_le(extra + at + 4 + skip, 8);
      return true;
    }
    at += 4 + n;
  }
  return false;
}

}  // namespace zip_offset_detail

using namespace zip_offset_detail;

int ZipArchive::data_fd() {
  if (!fd_.valid()) {
    auto fd = open_fd(path_, O_RDONLY, "torch zip");
    if (!fd.ok()) return -1;
    fd_ = std::move(fd).value();
  }
  return fd_.get();
}

bool ZipArchive::index_local_headers() {
  if (index_state_ != 0) return index_state_ > 0;
  index_state_ = -1;
  const int fd = data_fd();
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < base_) return false;
  const uint64_t len = std::min<uint64_t>(length_, static_cast<uint64_t>(st.st_size) - base_);
  length_ = len;
  uint64_t cd_off = 0, cd_size = 0;
  std::vector<unsigned char> cd;
  if (!zipoff_central_dir(fd, base_, len, cd_off, cd_size) || cd_size > kMaxCentralDirBytes ||
      !zipoff_read(fd, base_, len, cd_off, cd_size, cd))
    return false;
  for (uint64_t at = 0; at < cd_size;) {
    const unsigned char* h = cd.data() + at;
    if (cd_size - at < kCentralSize || zipoff_le(h, 4) != kCentralSig) return false;
    const uint64_t n = zipoff_le(h + 28, 2), m = zipoff_le(h + 30, 2), k = zipoff_le(h + 32, 2);
    if (kCentralSize + n + m + k > cd_size - at) return false;
    uint64_t lho = 0;
    if (!zipoff_local_offset(h, h + kCentralSize + n, m, lho)) return false;
    local_headers_.emplace(std::string(reinterpret_cast<const char*>(h + kCentralSize), n), lho);
    at += kCentralSize + n + m + k;
  }
  index_state_ = 1;
  return true;
}

std::optional<uint32_t> ZipArchive::local_crc(const Entry& e) {
  constexpr uint32_t kDescriptorSig = 0x08074b50;
  auto lh = index_local_headers() ? local_headers_.find(e.name) : local_headers_.end();
  std::vector<unsigned char> h;
  if (lh == local_headers_.end() || !zipoff_read(fd_.get(), base_, length_, lh->second, kLocalSize, h) || zipoff_le(h.data(), 4) != kLocalSig)
    return std::nullopt;
  const uint64_t flags = zipoff_le(h.data() + 6, 2);
  if ((flags & 0x8) == 0) return static_cast<uint32_t>(zipoff_le(h.data() + 14, 4));
  // Bit 3: the CRC follows the data in a data descriptor (its signature optional).
  const uint64_t data = lh->second + kLocalSize + zipoff_le(h.data() + 26, 2) + zipoff_le(h.data() + 28, 2);
  if (data > length_ || e.comp_size > length_ - data) return std::nullopt;
  std::vector<unsigned char> d;
  if (!zipoff_read(fd_.get(), base_, length_, data + e.comp_size, 8, d)) return std::nullopt;
  return static_cast<uint32_t>(zipoff_le(d.data(), 4) == kDescriptorSig ? zipoff_le(d.data() + 4, 4) : zipoff_le(d.data(), 4));
}

std::optional<uint64_t> ZipArchive::stored_data_offset(const Entry& e) {
  if (e.deflated) return std::nullopt;
  if (auto it = data_offsets_.find(e.index); it != data_offsets_.end()) return it->second;
  std::optional<uint64_t>& out = data_offsets_[e.index];
  auto lh = index_local_headers() ? local_headers_.find(e.name) : local_headers_.end();
  std::vector<unsigned char> h;
  if (lh == local_headers_.end() || !zipoff_read(fd_.get(), base_, length_, lh->second, kLocalSize + e.name.size(), h)) return out;
  const uint64_t n = zipoff_le(h.data() + 26, 2), m = zipoff_le(h.data() + 28, 2);
  const uint64_t data = lh->second + kLocalSize + n + m;
  const bool ok = zipoff_le(h.data(), 4) == kLocalSig && zipoff_le(h.data() + 8, 2) == 0 && n == e.name.size() &&
                  std::memcmp(h.data() + kLocalSize, e.name.data(), n) == 0 && data <= length_ && e.size <= length_ - data;
  if (ok) out = base_ + data;
  return out;
}

}  // namespace ckpt::torch
