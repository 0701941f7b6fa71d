#include "formats/store/direct_vfd.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <iterator>
#include <new>
#include <utility>

#include "formats/base/file_io.h"
#include "formats/dtype/dtype.h"

namespace ckpt::store {

namespace {

struct DirectVfdInfo {  // the driver's file access properties (copied by HDF5 as bytes)
  uint64_t file_bytes;
};

struct DirectVfdFile {
  H5FD_t pub;  // first: HDF5 hands back this pointer
  OutputFile* out;
  haddr_t eoa, eof;
  dev_t dev;
  ino_t ino;
};

thread_local Status tl_vfd_error;  // for shard_io_failure()

herr_t vfd_fail(Status st) {
  tl_vfd_error = std::move(st);
  return -1;
}

DirectVfdFile* vfd_of(const H5FD_t* f) { return reinterpret_cast<DirectVfdFile*>(const_cast<H5FD_t*>(f)); }

H5FD_t* vfd_open(const char* name, unsigned flags, hid_t fapl, haddr_t maxaddr) {
  if (!name || !*name || maxaddr == 0 || maxaddr == HADDR_UNDEF) return nullptr;
  const auto* info = static_cast<const DirectVfdInfo*>(H5Pget_driver_info(fapl));
  if (!info) return nullptr;
  int o = (flags & H5F_ACC_RDWR) ? O_RDWR : O_RDONLY;
  if (flags & H5F_ACC_TRUNC) o |= O_TRUNC;
  if (flags & H5F_ACC_CREAT) o |= O_CREAT;
  if (flags & H5F_ACC_EXCL) o |= O_EXCL;
  auto out = OutputFile::open(name, o, (flags & H5F_ACC_RDWR) ? IoMode::kDirect : IoMode::kBuffered, info->file_bytes);
  if (!out.ok()) return nullptr;
  struct stat sb{};
  if (::fstat(out->fd(), &sb) != 0) return nullptr;
  auto* f = new (std::nothrow) DirectVfdFile{};
  if (!f) return nullptr;
  f->out = new (std::nothrow) OutputFile(std::move(*out));
  if (!f->out) {
    delete f;
    return nullptr;
  }
  f->eof = static_cast<haddr_t>(sb.st_size);
  f->dev = sb.st_dev;
  f->ino = sb.st_ino;
  return &f->pub;
}

herr_t vfd_close(H5FD_t* h) {
  DirectVfdFile* f = vfd_of(h);
  const bool ok = f->out->close().ok();
  delete f->out;
  delete f;
  return ok ? 0 : -1;
}

int vfd_cmp(const H5FD_t* a, const H5FD_t* b) {
  const DirectVfdFile *x = vfd_of(a), *y = vfd_of(b);
  if (x->dev != y->dev) return x->dev < y->dev ? -1 : 1;
  if (x->ino != y->ino) return x->ino < y->ino ? -1 : 1;
  return 0;
}

herr_t vfd_query(const H5FD_t*, unsigned long* flags) {  // what sec2 declares
  if (flags)
    *flags = H5FD_FEAT_AGGREGATE_METADATA | H5FD_FEAT_ACCUMULATE_METADATA | H5FD_FEAT_DATA_SIEVE | H5FD_FEAT_AGGREGATE_SMALLDATA |
             H5FD_FEAT_POSIX_COMPAT_HANDLE | H5FD_FEAT_DEFAULT_VFD_COMPATIBLE;
  return 0;
}

haddr_t vfd_get_eoa(const H5FD_t* h, H5FD_mem_t) { return vfd_of(h)->eoa; }
herr_t vfd_set_eoa(H5FD_t* h, H5FD_mem_t, haddr_t a) {
  vfd_of(h)->eoa = a;
  return 0;
}
haddr_t vfd_get_eof(const H5FD_t* h, H5FD_mem_t) { return vfd_of(h)->eof; }

herr_t vfd_get_handle(H5FD_t* h, hid_t, void** handle) {
  static thread_local int fd;
  fd = vfd_of(h)->out->fd();
  *handle = &fd;
  return 0;
}

herr_t vfd_read(H5FD_t* h, H5FD_mem_t, hid_t, haddr_t addr, size_t size, void* buf) {
  DirectVfdFile* f = vfd_of(h);
  if (addr == HADDR_UNDEF || addr + size > f->eoa || addr + size < addr) return -1;
  char* p = static_cast<char*>(buf);
  while (size > 0) {  // past the end of the file reads zeros, as sec2
    ssize_t r = ::pread(f->out->fd(), p, size, static_cast<off_t>(addr));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) {
      std::fill(p, p + size, '\0');
      break;
    }
    p += r;
    addr += static_cast<haddr_t>(r);
    size -= static_cast<size_t>(r);
  }
  return 0;
}

herr_t vfd_write(H5FD_t* h, H5FD_mem_t type, hid_t, haddr_t addr, size_t size, const void* buf) {
  DirectVfdFile* f = vfd_of(h);
  if (addr == HADDR_UNDEF || addr + size > f->eoa || addr + size < addr) return -1;
  if (type == H5FD_MEM_DRAW && size >= kDirectVfdMinWrite) {
    Status st = f->out->write(buf, size, addr);
    if (!st.ok()) return vfd_fail(std::move(st));
  } else {
    Status st = pwrite_full(f->out->fd(), buf, size, addr, f->out->path());
    if (!st.ok()) return vfd_fail(std::move(st));
  }
  f->eof = std::max<haddr_t>(f->eof, addr + size);
  return 0;
}

herr_t vfd_truncate(H5FD_t* h, hid_t, hbool_t) {  // the file ends at the end of allocated space, as sec2
  DirectVfdFile* f = vfd_of(h);
  if (f->eoa == f->eof) return 0;
  if (::ftruncate(f->out->fd(), static_cast<off_t>(f->eoa)) != 0) return vfd_fail(Status::FromErrno("truncate failed", f->out->path(), errno));
  f->eof = f->eoa;
  return 0;
}

H5FD_class_t direct_vfd_class() {
  H5FD_class_t c{};
  c.name = "ckpt_direct";
  c.maxaddr = static_cast<haddr_t>(INT64_MAX);
  c.fc_degree = H5F_CLOSE_WEAK;
  c.fapl_size = sizeof(DirectVfdInfo);
  c.open = vfd_open;
  c.close = vfd_close;
  c.cmp = vfd_cmp;
  c.query = vfd_query;
  c.get_eoa = vfd_get_eoa;
  c.set_eoa = vfd_set_eoa;
  c.get_eof = vfd_get_eof;
  c.get_handle = vfd_get_handle;
  c.read = vfd_read;
  c.write = vfd_write;
  c.truncate = vfd_truncate;
  const H5FD_mem_t dichotomy[H5FD_MEM_NTYPES] = H5FD_FLMAP_DICHOTOMY;
  std::copy(std::begin(dichotomy), std::end(dichotomy), std::begin(c.fl_map));
  return c;
}

}  // namespace

Status shard_io_failure(const std::string& what, const std::string& path) {
  Status why = std::exchange(tl_vfd_error, Status::Ok());
  return why.ok() ? Status::Io(what + " failed (disk full?)").with_file(path) : std::move(why).with_context(what);
}

Result<H5Id> shard_file_access(const StoreOptions& opts, const std::vector<Piece>& pieces) {
  uint64_t file_bytes = 0;
  for (const auto& p : pieces) file_bytes += static_cast<uint64_t>(p.region.numel()) * dtype_size(p.dtype);
  if (opts.codec == Codec::kNone) {
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0 || H5Pset_meta_block_size(fapl, kShardMetaBlockBytes) < 0) {
      if (fapl >= 0) H5Pclose(fapl);
      return Status::Internal("HDF5 file access properties (metadata block size) failed");
    }
    return H5Id(fapl, H5Pclose);
  }
  if (resolve_io_mode(opts.io, file_bytes) != IoMode::kDirect) return H5Id(H5P_DEFAULT, nullptr);
  static const H5FD_class_t cls = direct_vfd_class();
  static const hid_t driver = H5FDregister(&cls);
  if (driver < 0) return Status::Internal("registering ckpt's HDF5 file driver failed");
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  const DirectVfdInfo info{file_bytes};
  if (fapl < 0 || H5Pset_driver(fapl, driver, &info) < 0) {
    if (fapl >= 0) H5Pclose(fapl);
    return Status::Internal("HDF5 file access properties for ckpt's file driver failed");
  }
  return H5Id(fapl, H5Pclose);
}

}  // namespace ckpt::store
