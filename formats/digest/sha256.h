// Streaming SHA-256 (OpenSSL EVP), hex-encoded: store piece digests, carried HF side files.
// Thread safety: a Sha256 is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ckpt {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  Sha256(Sha256&& o) noexcept;
  Sha256& operator=(Sha256&& o) noexcept;
  void update(const void* data, size_t n);
  // Lower-case hex of the digest; the object is reset afterwards.
  std::string hex_digest();

 private:
  void* ctx_ = nullptr;  // EVP_MD_CTX*
};

std::string sha256_hex(const void* data, size_t n);
bool is_sha256_hex(const std::string& s);  // 64 lower-case hex digits

}  // namespace ckpt
