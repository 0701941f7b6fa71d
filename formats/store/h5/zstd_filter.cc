#include "formats/store/h5/zstd_filter.h"

#include <zstd.h>

#include <cstdlib>
#include <mutex>

#include "formats/store/h5/h5_handles.h"

namespace ckpt::store {

namespace {

// HDF5 filter callback. On success replaces *buf (allocated with malloc, size *buf_size) with
// the output and returns its length; returns 0 on failure (HDF5 then fails the I/O call).
size_t zstd_filter_fn(unsigned int flags, size_t cd_nelmts, const unsigned int cd_values[],
                      size_t nbytes, size_t* buf_size, void** buf) {
  if (flags & H5Z_FLAG_REVERSE) {
    unsigned long long n = ZSTD_getFrameContentSize(*buf, nbytes);
    if (n == ZSTD_CONTENTSIZE_ERROR || n == ZSTD_CONTENTSIZE_UNKNOWN || n > kZstdMaxChunkBytes) return 0;
    void* out = std::malloc(n ? n : 1);
    if (!out) return 0;
    size_t got = ZSTD_decompress(out, n, *buf, nbytes);
    if (ZSTD_isError(got) || got != n) {
      std::free(out);
      return 0;
    }
    std::free(*buf);
    *buf = out;
    *buf_size = n ? n : 1;
    return got;
  }
  int level = cd_nelmts > 0 ? static_cast<int>(cd_values[0]) : 3;
  if (level < ZSTD_minCLevel() || level > ZSTD_maxCLevel()) level = 3;
  size_t cap = ZSTD_compressBound(nbytes);
  void* out = std::malloc(cap);
  if (!out) return 0;
  // One context per thread would be faster; HDF5 calls are serialized, so one static suffices.
  static ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 1);
  size_t got = ZSTD_compress2(cctx, out, cap, *buf, nbytes);
  if (ZSTD_isError(got)) {
    std::free(out);
    return 0;
  }
  std::free(*buf);
  *buf = out;
  *buf_size = cap;
  return got;
}

}  // namespace

Status register_zstd_filter() {
  static Status status = [] {
    auto lock = h5_lock();
    H5Z_class2_t cls{};
    cls.version = H5Z_CLASS_T_VERS;
    cls.id = kZstdFilterId;
    cls.encoder_present = 1;
    cls.decoder_present = 1;
    cls.name = "Zstandard";
    cls.can_apply = nullptr;
    cls.set_local = nullptr;
    cls.filter = zstd_filter_fn;
    if (H5Zregister(&cls) < 0) return Status::Internal("H5Zregister of the zstd filter (32015) failed");
    return Status::Ok();
  }();
  return status;
}

}  // namespace ckpt::store
