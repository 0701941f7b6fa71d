#include "formats/base/file_io.h"

#include <setjmp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <vector>

namespace ckpt {

namespace {

constexpr uint64_t kBlockBytes = 1 << 20;    // hashed and written at a time (stays in L2)
constexpr uint64_t kWindowBytes = 8ull << 20; // source mapped at a time (bounds RSS)

// `copying`: a copy to `what`; otherwise a read of the file `what`.
Status short_source(uint64_t n, const std::string& what, bool copying) {
  return Status::Error("ShortSource", copying ? "source file ended " + std::to_string(n) + " bytes early while copying to '" + what + "'"
                                                   : "file '" + what + "' ended " + std::to_string(n) + " bytes early");
}

Status shrank(const std::string& what, bool copying) {
  return Status::Error("ShortSource", copying ? "source file shrank while copying to '" + what + "'"
                                                   : "file '" + what + "' shrank while being read");
}

Status copy_through_buffer(int in_fd, uint64_t in_off, int out_fd, uint64_t out_off, uint64_t n, const std::string& what,
                           const std::function<void(const void*, size_t)>& each_block) {
  std::vector<char> buf(static_cast<size_t>(std::min<uint64_t>(n, kBlockBytes)));
  while (n > 0) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(n, buf.size()));
    ssize_t r = ::pread(in_fd, buf.data(), want, static_cast<off_t>(in_off));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::FromErrno("read failed while copying to", what, errno);
    if (r == 0) return short_source(n, what, out_fd >= 0);
    if (each_block) each_block(buf.data(), static_cast<size_t>(r));
    if (out_fd >= 0) CKPT_RETURN_IF_ERROR(pwrite_full(out_fd, buf.data(), static_cast<uint64_t>(r), out_off, what));
    in_off += static_cast<uint64_t>(r);
    out_off += static_cast<uint64_t>(r);
    n -= static_cast<uint64_t>(r);
  }
  return Status::Ok();
}

// SIGBUS from a mapped source that shrank: the faulting thread jumps back into the copy that
// armed t_bus_jump; any other SIGBUS keeps its default action.
thread_local sigjmp_buf* t_bus_jump = nullptr;

void on_sigbus(int sig, siginfo_t*, void*) {
  if (t_bus_jump) siglongjmp(*t_bus_jump, 1);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void install_sigbus_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, nullptr);
  });
}

// One window: maps [in_off, in_off + n) of the source and writes it block by block.
Status copy_window(int in_fd, uint64_t in_off, int out_fd, uint64_t out_off, uint64_t n, const std::string& what,
                   const std::function<void(const void*, size_t)>& each_block, bool* unmappable) {
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t base = in_off / page * page, len = in_off - base + n;
  void* m = ::mmap(nullptr, len, PROT_READ, MAP_SHARED | MAP_POPULATE, in_fd, static_cast<off_t>(base));
  if (m == MAP_FAILED) {
    *unmappable = true;
    return Status::Ok();
  }
  const char* src = static_cast<const char*>(m) + (in_off - base);
  Status st;
  sigjmp_buf jump;
  if (sigsetjmp(jump, 1) != 0) {  // the source shrank under the mapping
    t_bus_jump = nullptr;
    ::munmap(m, len);
    return shrank(what, out_fd >= 0);
  }
  t_bus_jump = &jump;  // (out_fd < 0: read_file_blocks, no copy)
  for (uint64_t done = 0; done < n && st.ok();) {
    const uint64_t k = std::min(kBlockBytes, n - done);
    if (each_block) each_block(src + done, static_cast<size_t>(k));
    if (out_fd >= 0) st = pwrite_full(out_fd, src + done, k, out_off + done, what);
    done += k;
  }
  t_bus_jump = nullptr;
  ::munmap(m, len);
  struct stat now {};
  if (!st.ok() && ::fstat(in_fd, &now) == 0 && static_cast<uint64_t>(now.st_size) < in_off + n)  // pwrite got EFAULT
    return shrank(what, out_fd >= 0);
  return st;
}

}  // namespace

Status pread_full(int fd, void* dst, uint64_t n, uint64_t off, const std::string& path) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    size_t want = n > (1u << 30) ? (1u << 30) : static_cast<size_t>(n);
    ssize_t r = ::pread(fd, p, want, static_cast<off_t>(off));
    if (r < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno("read failed", path, errno);
    }
    if (r == 0) return Status::Io("unexpected end of file at offset " + std::to_string(off) + " of '" + path + "' (truncated after open?)");
    p += r;
    off += static_cast<uint64_t>(r);
    n -= static_cast<uint64_t>(r);
  }
  return Status::Ok();
}

Status pwrite_full(int fd, const void* src, uint64_t n, uint64_t off, const std::string& path) {
  const auto* p = static_cast<const char*>(src);
  while (n > 0) {
    size_t want = n > (1u << 30) ? (1u << 30) : static_cast<size_t>(n);
    ssize_t r = ::pwrite(fd, p, want, static_cast<off_t>(off));
    if (r < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno("write failed", path, errno);
    }
    p += r;
    off += static_cast<uint64_t>(r);
    n -= static_cast<uint64_t>(r);
  }
  return Status::Ok();
}

Status copy_file_bytes(int in_fd, uint64_t in_off, int out_fd, uint64_t out_off, uint64_t n, const std::string& what,
                       const std::function<void(const void*, size_t)>& each_block) {
  if (n == 0) return Status::Ok();
  struct stat st {};
  if (::fstat(in_fd, &st) != 0) return Status::FromErrno("cannot stat the source of", what, errno);
  const uint64_t size = st.st_size > 0 ? static_cast<uint64_t>(st.st_size) : 0;
  if (!S_ISREG(st.st_mode)) return copy_through_buffer(in_fd, in_off, out_fd, out_off, n, what, each_block);
  if (in_off > size || size - in_off < n) return short_source(n - (in_off < size ? size - in_off : 0), what, out_fd >= 0);
  install_sigbus_handler();
  for (uint64_t done = 0; done < n;) {
    const uint64_t k = std::min(kWindowBytes, n - done);
    bool unmappable = false;
    CKPT_RETURN_IF_ERROR(copy_window(in_fd, in_off + done, out_fd, out_off + done, k, what, each_block, &unmappable));
    if (unmappable) return copy_through_buffer(in_fd, in_off + done, out_fd, out_off + done, n - done, what, each_block);
    done += k;
  }
  return Status::Ok();
}

Status with_mapped_range(int fd, uint64_t off, uint64_t n, const std::string& what,
                         const std::function<void(const uint8_t*)>& fn) {
  if (n == 0) return Status::Ok();
  install_sigbus_handler();
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t base = off / page * page, len = off - base + n;
  void* m = ::mmap(nullptr, len, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, static_cast<off_t>(base));
  if (m == MAP_FAILED) return Status::FromErrno("cannot map " + std::to_string(n) + " bytes of", what, errno);
  sigjmp_buf jump;
  if (sigsetjmp(jump, 1) != 0) {  // the file shrank under the mapping
    t_bus_jump = nullptr;
    ::munmap(m, len);
    return shrank(what, false);
  }
  t_bus_jump = &jump;
  fn(static_cast<const uint8_t*>(m) + (off - base));
  t_bus_jump = nullptr;
  ::munmap(m, len);
  return Status::Ok();
}

Status read_file_blocks(int fd, uint64_t off, uint64_t n, const std::string& what,
                        const std::function<void(const void*, size_t)>& each_block) {
  return copy_file_bytes(fd, off, -1, 0, n, what, each_block);
}

bool copy_from_mapping(void* dst, const void* mapped_src, size_t n) {
  install_sigbus_handler();
  sigjmp_buf jump;
  // No signal mask saved (no syscall per call): after a SIGBUS the handler's blocked mask stays,
  // so unblock SIGBUS on that (rare) path.
  if (sigsetjmp(jump, 0) != 0) {
    t_bus_jump = nullptr;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGBUS);
    ::pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
    return false;
  }
  t_bus_jump = &jump;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  std::memcpy(dst, mapped_src, n);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_bus_jump = nullptr;
  return true;
}

}  // namespace ckpt
