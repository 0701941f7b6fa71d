// IoBuffer: a multi-MiB, page-aligned buffer for direct I/O and staging copies, mapped from the
// kernel and unmapped when it goes, never taken from malloc.
//
// Why not posix_memalign: glibc raises its mmap threshold to the size of every mapped chunk freed
// (up to 32 MiB), so after the first multi-MiB buffer is freed the next ones come from the
// threads' malloc arenas, which keep freed memory. With buffers of varying sizes freed and taken
// on many threads (direct-read windows, per-thread staging buffers of pools that come and go),
// `ckpt reshard --io direct --max-memory 64M` of a 3.08 GB checkpoint peaked at 165-310 MiB; with
// mapped buffers, at the budget (tests/python/test_memory.py checks every --io mode).
// Thread safety: an IoBuffer is one object; distinct objects on any threads.
#pragma once

#include <cstdint>
#include <utility>

namespace ckpt {

class IoBuffer {
 public:
  IoBuffer() = default;
  explicit IoBuffer(uint64_t bytes);  // bytes rounded up to pages; data() nullptr when refused
  ~IoBuffer();
  IoBuffer(IoBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  IoBuffer& operator=(IoBuffer&& o) noexcept;
  IoBuffer(const IoBuffer&) = delete;
  IoBuffer& operator=(const IoBuffer&) = delete;

  char* data() const { return p_; }
  uint64_t size() const { return bytes_; }  // as asked for (0 when refused)

 private:
  char* p_ = nullptr;
  uint64_t bytes_ = 0;
};

}  // namespace ckpt
