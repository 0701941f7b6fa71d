// Positional file I/O: whole-length pread/pwrite (retrying short transfers and EINTR), and
// file-to-file copy of a byte range. The copy maps the source range (read-only, a window of a few
// MiB at a time) and pwrites it: one page-cache copy, like copy_file_range, but full-page writes
// whatever the source and target offsets are modulo the page size (copy_file_range on ext4
// splices page by page, and when the two offsets differ mod 4096 every target page is written in
// two partial halves, ~40% slower), and a caller can look at each block on its way (hashing).
// A source file that shrinks while mapped is reported as an error (SIGBUS is caught on the
// copying thread), never a crash. Falls back to pread/pwrite when the source cannot be mapped.
// Thread safety: reentrant; uses explicit offsets, never the descriptors' file positions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "formats/base/status.h"

namespace ckpt {

// Reads exactly `n` bytes at `off`; kIo naming `path` on error or end of file.
Status pread_full(int fd, void* dst, uint64_t n, uint64_t off, const std::string& path);
// Writes exactly `n` bytes at `off`; kIo naming `path` on error (disk full, ...).
Status pwrite_full(int fd, const void* src, uint64_t n, uint64_t off, const std::string& path);

// Copies `n` bytes from `in_fd` at `in_off` to `out_fd` at `out_off`. `each_block`, when given,
// sees the bytes in order, block by block (<= 1 MiB), just before each block is written. A short
// source (end of file before n bytes) is a kCorruption error "ShortSource"; errors name `what`.
Status copy_file_bytes(int in_fd, uint64_t in_off, int out_fd, uint64_t out_off, uint64_t n, const std::string& what,
                       const std::function<void(const void*, size_t)>& each_block = {});
// The same without the copy: `each_block` sees bytes [off, off + n) of `fd` in order (hashing a
// range of a file without a buffer); errors name `what` (the file).
Status read_file_blocks(int fd, uint64_t off, uint64_t n, const std::string& what,
                        const std::function<void(const void*, size_t)>& each_block);

// Runs `fn` on bytes [off, off + n) of `fd` mapped read-only (populated from the page cache in one
// call), then unmaps them: a reader that needs no copy (a transpose straight from the source
// rows, converters/profile/profile_view_target.cc). A file that shrinks under the mapping is a
// "ShortSource" error naming `what` (the SIGBUS is caught on this thread; `fn` must hold nothing
// that needs unwinding); a range that cannot be mapped is an I/O error. n == 0: fn is not called.
Status with_mapped_range(int fd, uint64_t off, uint64_t n, const std::string& what,
                         const std::function<void(const uint8_t*)>& fn);

// memcpy from a mapping of a file that may shrink under it: false (instead of SIGBUS killing the
// process) when a source page no longer exists. For gathers of mapped ranges (formats/io/output_file.h).
bool copy_from_mapping(void* dst, const void* mapped_src, size_t n);

}  // namespace ckpt
