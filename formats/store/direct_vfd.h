// An HDF5 file driver for the store's compressed shards: the POSIX driver's behaviour (sec2:
// pread/pwrite at the address HDF5 gives, end of file tracked the same way), except that raw-data
// writes of at least kDirectVfdMinWrite bytes -- the stored chunks H5Dwrite_chunk hands down --
// go through OutputFile (formats/io/output_file.h): their whole 4 KiB blocks with O_DIRECT, the
// unaligned head and tail through the page cache, buffered for good where the file system refuses
// O_DIRECT. Metadata, small writes and every read use the buffered descriptor.
// Why: a compressed shard is written by HDF5, so the store's own direct writes of raw pieces never
// saw its bytes; through the page cache the calling thread copied every stored byte into it and
// the kernel wrote it back later (measured: the copy alone ~0.9 CPU s per 1.5 GB stored, on the
// thread that also feeds the compressing pool; docs/BENCHMARKS.md "Compressed store").
// The driver decides only how bytes reach the disk: the file's bytes are those sec2 writes (no
// driver info in the superblock), h5py and every other reader open it with the default driver.
// Thread safety: HDF5 calls it under h5_lock() (formats/store/h5/h5_handles.h), as every HDF5 call.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

#include "formats/base/status.h"
#include "formats/io/output_file.h"
#include "formats/store/h5/h5_handles.h"
#include "formats/store/store_options.h"
#include "formats/tensor/tensor_io.h"

namespace ckpt::store {

inline constexpr uint64_t kDirectVfdMinWrite = 64u << 10;
inline constexpr uint64_t kShardMetaBlockBytes = 64u << 10;

// The file access property list for H5Fcreate of a shard holding `pieces` written with `opts`:
// this driver when the shard is compressed and opts.io resolves to direct for the pieces'
// uncompressed size (an upper bound of the file's), else HDF5's sec2 driver with metadata blocks of
// kShardMetaBlockBytes. Uncompressed pieces are written by OutputFile itself; HDF5 writes only their
// metadata, which it places in blocks between the pieces' data: 2 KiB blocks (HDF5's default) left a
// gap every five pieces or so in the data a shard's writes gather into whole requests (nine per
// 0.5 GB shard of a 3.08 GB reshard, 54 of its 187 requests cut in two); 64 KiB blocks hold the
// metadata of ~150 pieces each. Call under h5_lock().
Result<H5Id> shard_file_access(const StoreOptions& opts, const std::vector<Piece>& pieces);

// The error of an HDF5 call `what` on shard `path` that failed: why this driver's last write or
// truncation on this thread failed (the system's error naming the file: "File too large", "No space
// left on device"; then forgotten), prefixed by `what`; else "<what> failed (disk full?)". HDF5
// itself reports a failed driver call only as "write failed".
Status shard_io_failure(const std::string& what, const std::string& path);

}  // namespace ckpt::store
