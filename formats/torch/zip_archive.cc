#include "formats/torch/zip_archive.h"

#include <zip.h>

#include "formats/file_io.h"

#include <algorithm>
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

Result<std::string> ZipArchive::read_all(const Entry& e, uint64_t max_bytes, const char* too_large_code) {
  if (e.size > max_bytes)
    return ziparchive_err(too_large_code, path_, "entry '" + e.name + "' declares " + std::to_string(e.size) + " bytes, more than the bound " + std::to_string(max_bytes));
  std::string s(static_cast<size_t>(e.size), '\0');
  CKPT_RETURN_IF_ERROR(read(e, 0, e.size, s.data()));
  return s;
}

}  // namespace ckpt::torch
