#include "formats/io/io_buffer.h"

#include <sys/mman.h>

#include <utility>

namespace ckpt {

IoBuffer::IoBuffer(uint64_t bytes) {
  if (bytes == 0) return;
  void* m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return;
  p_ = static_cast<char*>(m);
  bytes_ = bytes;
}

IoBuffer::~IoBuffer() {
  if (p_) ::munmap(p_, bytes_);
}

IoBuffer& IoBuffer::operator=(IoBuffer&& o) noexcept {
  if (this != &o) {
    IoBuffer old(std::move(*this));
    p_ = std::exchange(o.p_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

}  // namespace ckpt
