// One streaming digest over the algorithms a native-store piece may be hashed with:
//   xxh3-128  XXH3 128-bit (libxxhash), hex of its canonical big-endian form (32 hex digits; what
//             Python's xxhash.xxh3_128_hexdigest prints). The default: a digest stored beside the
//             data it guards, unsigned, protects against accidental corruption only, which a
//             128-bit checksum does at memory speed (~31 GB/s against SHA-256's 1.4-1.9 GB/s).
//   sha256    SHA-256 (OpenSSL EVP, formats/digest/sha256.h), 64 hex digits: for digests published or
//             pinned elsewhere.
// A digest is written "<algorithm>:<lower-case hex>" (DigestValue::to_string), e.g.
// "xxh3-128:0123...". Unknown algorithm names are UnknownDigest, malformed text BadField.
// Thread safety: a Digest is used by one thread at a time; the functions are pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "formats/base/status.h"

namespace ckpt {

enum class DigestAlgo : uint8_t { kXxh3_128, kSha256 };

inline constexpr DigestAlgo kDefaultDigest = DigestAlgo::kXxh3_128;

const char* digest_algo_name(DigestAlgo a);  // "xxh3-128", "sha256"
// "xxh3-128" or "sha256"; anything else UnknownDigest (kind unsupported) naming the text.
Result<DigestAlgo> digest_algo_from_name(const std::string& name);
size_t digest_hex_size(DigestAlgo a);        // 32 or 64
// `hex` has exactly digest_hex_size(a) lower-case hex digits.
bool is_digest_hex(DigestAlgo a, const std::string& hex);

// A computed or recorded digest: its algorithm and lower-case hex.
struct DigestValue {
  DigestAlgo algo = kDefaultDigest;
  std::string hex;
  std::string to_string() const;  // "<name>:<hex>"
  bool operator==(const DigestValue& o) const = default;
};

// Parses "<name>:<hex>": no ':' or a hex of the wrong length or case is BadField, an unknown name
// UnknownDigest. Messages start with `where`.
Result<DigestValue> parse_digest(const std::string& text, const std::string& where);

// Streaming digest of one algorithm. Movable; hex_digest() resets it for reuse.
class Digest {
 public:
  explicit Digest(DigestAlgo algo = kDefaultDigest);
  ~Digest();
  Digest(Digest&& o) noexcept;
  Digest& operator=(Digest&& o) noexcept;
  Digest(const Digest&) = delete;
  Digest& operator=(const Digest&) = delete;

  DigestAlgo algo() const { return algo_; }
  void update(const void* data, size_t n);
  std::string hex_digest();              // lower-case hex; the object is reset afterwards
  DigestValue value() { return {algo_, hex_digest()}; }

 private:
  struct State;
  DigestAlgo algo_;
  std::unique_ptr<State> state_;
};

// One-shot digest of a buffer.
DigestValue digest_of(DigestAlgo algo, const void* data, size_t n);

}  // namespace ckpt
