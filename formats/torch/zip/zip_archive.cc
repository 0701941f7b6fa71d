#include "formats/torch/zip/zip_archive.h"

#include <zip.h>
#include <zlib.h>

#include "formats/base/file_io.h"

#include <algorithm>
#include <cstdio>
#include <vector>

namespace ckpt::torch {

namespace {

Status ziparchive_err(const char* code, const std::string& path, const std::string& msg) {
  return Status::Error(code, "torch zip: " + msg).with_file(path);
}

}  // namespace

Result<std::unique_ptr<ZipArchive>> ZipArchive::open(const std::string& path, uint64_t offset, uint64_t length) {
  zip_error_t ze;
  zip_error_init(&ze);
  zip_int64_t len = length == UINT64_MAX ? -1 : static_cast<zip_int64_t>(length);  // -1: to the end
  if (length != UINT64_MAX && length > static_cast<uint64_t>(INT64_MAX))
    return ziparchive_err("TorchReadRange", path, "byte range length " + std::to_string(length) + " too large");
  zip_source_t* src = zip_source_file_create(path.c_str(), offset, len, &ze);
  if (src == nullptr) {
    int sys = zip_error_code_system(&ze);
    std::string m = zip_error_strerror(&ze);
    zip_error_fini(&ze);
    if (sys != 0) return Status::FromErrno("cannot open", path, sys);
    return ziparchive_err("TorchZipCorrupt", path, "cannot open the byte range: " + m);
  }
  zip_t* za = zip_open_from_source(src, ZIP_RDONLY | ZIP_CHECKCONS, &ze);
  if (za == nullptr) {
    int code = zip_error_code_zip(&ze);
    std::string m = zip_error_strerror(&ze);
    zip_error_fini(&ze);
    zip_source_free(src);
    if (code == ZIP_ER_NOZIP)
      return ziparchive_err("TorchNotZip", path, "not a zip archive (torch.save files are zips): " + m);
    if (code == ZIP_ER_OPEN) return ziparchive_err("TorchZipCorrupt", path, "cannot open: " + m);
    return ziparchive_err("TorchZipCorrupt", path, "the zip is damaged or truncated: " + m);
  }
  zip_error_fini(&ze);
  std::unique_ptr<ZipArchive> a(new ZipArchive());
  a->path_ = path;
  a->base_ = offset;
  a->length_ = length;
  a->za_ = za;
  return a;
}

ZipArchive::~ZipArchive() {
  close_stream();
  if (za_ != nullptr) zip_discard(za_);
}

void ZipArchive::close_stream() {
  if (stream_ != nullptr) zip_fclose(stream_);
  stream_ = nullptr;
}

Status ZipArchive::zip_error(const std::string& what) const {
  return ziparchive_err("TorchZipCorrupt", path_, what + ": " + zip_strerror(za_));
}

uint64_t ZipArchive::num_entries() const {
  zip_int64_t n = zip_get_num_entries(za_, 0);
  return n < 0 ? 0 : static_cast<uint64_t>(n);
}

Result<ZipArchive::Entry> ZipArchive::entry(uint64_t i) const {
  zip_stat_t st;
  zip_stat_init(&st);
  if (zip_stat_index(za_, i, 0, &st) != 0) return zip_error("entry " + std::to_string(i));
  Entry e;
  e.index = i;
  e.name = (st.valid & ZIP_STAT_NAME) && st.name != nullptr ? st.name : "";
  e.size = st.size;
  e.comp_size = st.comp_size;
  if ((st.valid & ZIP_STAT_ENCRYPTION_METHOD) && st.encryption_method != ZIP_EM_NONE)
    return ziparchive_err("TorchZipMethod", path_, "entry '" + e.name + "' is encrypted");
  if (st.comp_method != ZIP_CM_STORE && st.comp_method != ZIP_CM_DEFLATE)
    return ziparchive_err("TorchZipMethod", path_, "entry '" + e.name + "' uses compression method " + std::to_string(st.comp_method) +
                                                "; only stored (0) and deflated (8) are read");
  e.deflated = st.comp_method == ZIP_CM_DEFLATE;
  e.crc = (st.valid & ZIP_STAT_CRC) ? st.crc : 0;
  return e;
}

Result<std::optional<ZipArchive::Entry>> ZipArchive::find(const std::string& name) const {
  zip_int64_t i = zip_name_locate(za_, name.c_str(), 0);
  if (i < 0) return std::optional<Entry>();
  CKPT_ASSIGN_OR_RETURN(Entry e, entry(static_cast<uint64_t>(i)));
  return std::optional<Entry>(std::move(e));
}

Status ZipArchive::read(const Entry& e, uint64_t offset, uint64_t bytes, void* dst) {
  if (bytes == 0) return Status::Ok();
  if (!e.deflated)
    if (std::optional<uint64_t> at = stored_data_offset(e)) return pread_full(fd_.get(), dst, bytes, *at + offset, path_);
  bool reuse = stream_ != nullptr && stream_index_ == e.index && (!e.deflated || stream_pos_ <= offset);
  if (!reuse) {
    close_stream();
    stream_ = zip_fopen_index(za_, e.index, 0);
    if (stream_ == nullptr) return zip_error("cannot open entry '" + e.name + "'");
    stream_index_ = e.index;
    stream_pos_ = 0;
  }
  if (!e.deflated) {
    if (stream_pos_ != offset) {
      if (zip_fseek(stream_, static_cast<zip_int64_t>(offset), SEEK_SET) != 0)
        return ziparchive_err("TorchZipCorrupt", path_, "cannot seek in entry '" + e.name + "': " + zip_file_strerror(stream_));
      stream_pos_ = offset;
    }
  } else {
    // Inflate forward to `offset`, through a bounded scratch buffer.
    std::vector<char> skip(static_cast<size_t>(std::min<uint64_t>(offset - stream_pos_, 1u << 20)));
    while (stream_pos_ < offset) {
      uint64_t n = std::min<uint64_t>(offset - stream_pos_, skip.size());
      zip_int64_t r = zip_fread(stream_, skip.data(), n);
      if (r <= 0) {
        close_stream();
        return ziparchive_err("TorchZipCorrupt", path_, "entry '" + e.name + "' ends or fails to inflate before byte " + std::to_string(offset));
      }
      stream_pos_ += static_cast<uint64_t>(r);
    }
  }
  auto* out = static_cast<char*>(dst);
  uint64_t done = 0;
  while (done < bytes) {
    zip_int64_t r = zip_fread(stream_, out + done, bytes - done);
    if (r <= 0) {
      std::string why = r < 0 ? zip_file_strerror(stream_) : "unexpected end of data";
      close_stream();
      return ziparchive_err("TorchZipCorrupt", path_, "reading entry '" + e.name + "' at byte " + std::to_string(offset + done) + ": " + why);
    }
    done += static_cast<uint64_t>(r);
    stream_pos_ += static_cast<uint64_t>(r);
  }
  return Status::Ok();
}

namespace {

constexpr uint64_t kCrcChunk = 4ull << 20;  // bytes hashed per read

std::string crc_hex(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08x", v);
  return b;
}

uint32_t crc_update(uint32_t crc, const char* p, uint64_t n) {
  return static_cast<uint32_t>(::crc32_z(crc, reinterpret_cast<const Bytef*>(p), static_cast<z_size_t>(n)));
}

}  // namespace

Result<std::string> ZipArchive::read_all(const Entry& e, uint64_t max_bytes, const char* too_large_code) {
  if (e.size > max_bytes)
    return ziparchive_err(too_large_code, path_,
                          "entry '" + e.name + "' declares " + std::to_string(e.size) + " bytes, more than the bound " + std::to_string(max_bytes));
  std::string s(static_cast<size_t>(e.size), '\0');
  CKPT_RETURN_IF_ERROR(read(e, 0, e.size, s.data()));
  // An entry read whole (data.pkl, byteorder, version) is checked before it is parsed: its bytes
  // are in hand, so the CRC-32 costs one pass over them.
  const uint32_t crc = crc_update(0, s.data(), s.size());
  if (crc != e.crc)
    return ziparchive_err("ZipCrcMismatch", path_, "entry '" + e.name + "': CRC-32 of its " + std::to_string(e.size) + " bytes is " + crc_hex(crc) +
                                                       ", the central directory says " + crc_hex(e.crc) +
                                                       " (the entry's bytes changed since it was written)");
  return s;
}

Status ZipArchive::check_crc(const Entry& e, const std::function<void(uint64_t)>& on_bytes) {
  std::vector<char> buf(static_cast<size_t>(std::min<uint64_t>(std::max<uint64_t>(e.size, 1), kCrcChunk)));
  uint32_t crc = static_cast<uint32_t>(::crc32_z(0, nullptr, 0));
  bool libzip_crc_error = false;
  std::optional<uint64_t> at = e.deflated ? std::nullopt : stored_data_offset(e);
  if (at) {  // a stored entry, read in place
    for (uint64_t done = 0; done < e.size;) {
      const uint64_t n = std::min<uint64_t>(e.size - done, buf.size());
      CKPT_RETURN_IF_ERROR(pread_full(fd_.get(), buf.data(), n, *at + done, path_));
      crc = crc_update(crc, buf.data(), n);
      done += n;
      if (on_bytes) on_bytes(n);
    }
  } else {  // through libzip (inflating a deflated entry), forward only, own handle
    zip_file_t* f = zip_fopen_index(za_, e.index, 0);
    if (f == nullptr) return zip_error("cannot open entry '" + e.name + "'");
    uint64_t done = 0;
    while (true) {
      zip_int64_t r = zip_fread(f, buf.data(), buf.size());
      if (r < 0) {
        // libzip checks the CRC itself once the whole entry is read: take that as a mismatch
        // (the bytes it returned are all hashed by then).
        libzip_crc_error = zip_error_code_zip(zip_file_get_error(f)) == ZIP_ER_CRC && done == e.size;
        if (!libzip_crc_error) {
          std::string why = zip_file_strerror(f);
          zip_fclose(f);
          return ziparchive_err("TorchZipCorrupt", path_, "entry '" + e.name + "' cannot be read for its CRC-32 check at byte " +
                                                              std::to_string(done) + ": " + why);
        }
        break;
      }
      if (r == 0) break;
      crc = crc_update(crc, buf.data(), static_cast<uint64_t>(r));
      done += static_cast<uint64_t>(r);
      if (on_bytes) on_bytes(static_cast<uint64_t>(r));
    }
    zip_fclose(f);
    if (done != e.size)
      return ziparchive_err("TorchZipCorrupt", path_,
                            "entry '" + e.name + "' holds " + std::to_string(done) + " bytes, the central directory declares " +
                                std::to_string(e.size));
  }
  if (crc != e.crc || libzip_crc_error)
    return ziparchive_err("ZipCrcMismatch", path_, "entry '" + e.name + "': CRC-32 of its " + std::to_string(e.size) + " bytes is " + crc_hex(crc) +
                                                       ", the central directory says " + crc_hex(e.crc) +
                                                       " (the entry's bytes changed since it was written)");
  if (std::optional<uint32_t> local = local_crc(e); local && *local != e.crc)
    return ziparchive_err("ZipCrcMismatch", path_, "entry '" + e.name + "': its local record says CRC-32 " + crc_hex(*local) +
                                                       ", the central directory " + crc_hex(e.crc));
  return Status::Ok();
}

}  // namespace ckpt::torch
