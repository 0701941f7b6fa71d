// An HDF5 file driver for the store's compressed shards: the POSIX driver's behaviour (sec2:
// pread/pwrite at the address HDF5 gives, end of file tracked the same way), except that raw-data
// writes of at least kDirectVfdMinWrite bytes -- the stored chunks H5Dwrite_chunk hands down --
// go through OutputFile (formats/file_io_direct.h): their whole 4 KiB blocks with O_DIRECT, the
// unaligned head and tail through the page cache, buffered for good where the file system refuses
// O_DIRECT. Metadata, small writes and every read use the buffered descriptor.
// Why: a compressed shard is written by HDF5, so the store's own direct writes of raw pieces never
// saw its bytes; through the page cache the calling thread copied every stored byte into it and
// the kernel wrote it back later (measured: the copy alone ~0.9 CPU s per 1.5 GB stored, on the
// thread that also feeds the compressing pool; docs/BENCHMARKS.md, issue 15).
// The driver decides only how bytes reach the disk: the file's bytes are those sec2 writes (no
// driver info in the superblock), h5py and every other reader open it with the default driver.
// Thread safety: HDF5 calls it under h5_lock() (formats/store/h5_handles.h), as every HDF5 call.
#pragma once

#include <hdf5.h>

#include <cstdint>

#include "formats/file_io_direct.h"
#include "formats/status.h"

namespace ckpt::store {

inline constexpr uint64_t kDirectVfdMinWrite = 64u << 10;

// A file access property list for H5Fcreate of a shard of about `file_bytes` bytes: this driver
// when `mode` resolves to direct for that size (resolve_io_mode), else the default one. The
// caller closes it (H5Pclose) when it is not H5P_DEFAULT. Call under h5_lock().
Result<hid_t> shard_file_access(IoMode mode, uint64_t file_bytes);

// Why this driver's last write or truncation on this thread failed (the system's error, naming
// the file: "File too large", "No space left on device"), then forgotten; Ok when none did. HDF5
// reports a failed driver call only as "write failed": callers add this to their error.
Status take_shard_io_error();

}  // namespace ckpt::store
