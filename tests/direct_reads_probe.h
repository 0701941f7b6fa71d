// Does the file system holding `path` take O_DIRECT reads at all? (tmpfs of old kernels does not.)
// The direct-I/O tests ask before they expect direct reads.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace ckpt::testing {

inline bool direct_reads_ok(const std::string& path) {
  const int d = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  if (d < 0) return false;
  void* p = nullptr;
  if (::posix_memalign(&p, 4096, 4096) != 0) {
    ::close(d);
    return false;
  }
  const bool ok = ::pread(d, p, 4096, 0) >= 0;
  std::free(p);
  ::close(d);
  return ok;
}

}  // namespace ckpt::testing
