#include "formats/file_copy.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

namespace ckpt {

namespace {

Status copy_through_buffer(int in_fd, uint64_t in_off, int out_fd, uint64_t out_off, uint64_t n, const std::string& what) {
  std::vector<char> buf(static_cast<size_t>(std::min<uint64_t>(n, 1u << 20)));
  while (n > 0) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(n, buf.size()));
    ssize_t r = ::pread(in_fd, buf.data(), want, static_cast<off_t>(in_off));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::FromErrno("read failed while copying to", what, errno);
    if (r == 0) return Status::Corruption("ShortSource", "source file ended " + std::to_string(n) + " bytes early while copying to '" + what + "'");
    size_t done = 0;
    while (done < static_cast<size_t>(r)) {
      ssize_t w = ::pwrite(out_fd, buf.data() + done, static_cast<size_t>(r) - done, static_cast<off_t>(out_off + done));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return Status::FromErrno("write failed", what, errno);
      done += static_cast<size_t>(w);
    }
    in_off += static_cast<uint64_t>(r);
    out_off += static_cast<uint64_t>(r);
    n -= static_cast<uint64_t>(r);
  }
  return Status::Ok();
}

}  // namespace

Status copy_file_bytes(int in_fd, uint64_t in_off, int out_fd, uint64_t out_off, uint64_t n, const std::string& what) {
  while (n > 0) {
    loff_t in = static_cast<loff_t>(in_off), out = static_cast<loff_t>(out_off);
    ssize_t r = ::copy_file_range(in_fd, &in, out_fd, &out, static_cast<size_t>(std::min<uint64_t>(n, 1u << 30)), 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP))
      return copy_through_buffer(in_fd, in_off, out_fd, out_off, n, what);
    if (r < 0) return Status::FromErrno("copy_file_range failed", what, errno);
    if (r == 0) return Status::Corruption("ShortSource", "source file ended " + std::to_string(n) + " bytes early while copying to '" + what + "'");
    in_off += static_cast<uint64_t>(r);
    out_off += static_cast<uint64_t>(r);
    n -= static_cast<uint64_t>(r);
  }
  return Status::Ok();
}

}  // namespace ckpt
