#include "formats/digest/sha256.h"

#include <openssl/evp.h>

#include <cstdlib>
#include <utility>

namespace ckpt {

Sha256::Sha256() {
  ctx_ = EVP_MD_CTX_new();
  if (!ctx_ || EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr) != 1) std::abort();
}
Sha256::~Sha256() {
  if (ctx_) EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_));
}
Sha256::Sha256(Sha256&& o) noexcept : ctx_(std::exchange(o.ctx_, nullptr)) {}
Sha256& Sha256::operator=(Sha256&& o) noexcept {
  if (this != &o) {
    if (ctx_) EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_));
    ctx_ = std::exchange(o.ctx_, nullptr);
  }
  return *this;
}
void Sha256::update(const void* data, size_t n) {
  if (n) EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, n);
}
std::string Sha256::hex_digest() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  auto* c = static_cast<EVP_MD_CTX*>(ctx_);
  EVP_DigestFinal_ex(c, md, &len);
  EVP_DigestInit_ex(c, EVP_sha256(), nullptr);
  static const char* kHex = "0123456789abcdef";
  std::string s(2 * len, '0');
  for (unsigned i = 0; i < len; ++i) {
    s[2 * i] = kHex[md[i] >> 4];
    s[2 * i + 1] = kHex[md[i] & 15];
  }
  return s;
}

std::string sha256_hex(const void* data, size_t n) {
  Sha256 h;
  h.update(data, n);
  return h.hex_digest();
}

bool is_sha256_hex(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

}  // namespace ckpt
