// File-to-file copy of a byte range in the kernel (copy_file_range: no user-space buffer; on
// ext4 one page-cache copy, on filesystems with reflinks none). Falls back to pread/pwrite
// through a small buffer where the kernel refuses (other filesystem types, old kernels).
// Thread safety: reentrant; uses explicit offsets, never the descriptors' file positions.
#pragma once

#include <cstdint>
#include <string>

#include "formats/status.h"

namespace ckpt {

// Copies `n` bytes from `in_fd` at `in_off` to `out_fd` at `out_off`. A short source (end of
// file before n bytes) is a kCorruption error; errors name `what` (the output file).
Status copy_file_bytes(int in_fd, uint64_t in_off, int out_fd, uint64_t out_off, uint64_t n, const std::string& what);

}  // namespace ckpt
