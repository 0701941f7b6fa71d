// HDF5 filter 32015 ("Zstandard") implemented in-process with libzstd, compatible with the
// registered filter (hdf5plugin / HDF5 filter plugins): cd_values[0] = compression level; every
// chunk is one zstd frame with its content size (and a content checksum) set.
// Thread safety: register_zstd_filter() is idempotent and safe from any thread; the filter itself
// runs inside HDF5 calls, i.e. under h5_lock().
#pragma once

#include "formats/base/status.h"

namespace ckpt::store {

inline constexpr int kZstdFilterId = 32015;
// Largest decompressed chunk the filter accepts (a frame claiming more is treated as corrupt).
inline constexpr unsigned long long kZstdMaxChunkBytes = 1ull << 30;

// Registers the filter with HDF5 once per process (no-op afterwards).
Status register_zstd_filter();

}  // namespace ckpt::store
