#include "formats/digest/digest.h"

#include <xxhash.h>
#if defined(__x86_64__)
#include <xxh_x86dispatch.h>
#endif

#include <cstdlib>
#include <utility>

#include "formats/digest/sha256.h"

namespace ckpt {

namespace {

// libxxhash's runtime-dispatched update (AVX-512 / AVX2 / SSE2 as the CPU allows): Debian builds
// the plain entry points for baseline x86-64 (SSE2), ~3x slower (8.5 against 26 GB/s measured on
// one core of the development machine, data in cache). Same result on every path.
void xxh3_update(XXH3_state_t* st, const void* data, size_t n) {
#if defined(__x86_64__)
  XXH3_128bits_update_dispatch(st, data, n);
#else
  XXH3_128bits_update(st, data, n);
#endif
}

constexpr const char* kHex = "0123456789abcdef";

std::string hex_of(const unsigned char* p, size_t n) {
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = kHex[p[i] >> 4];
    s[2 * i + 1] = kHex[p[i] & 15];
  }
  return s;
}

}  // namespace

const char* digest_algo_name(DigestAlgo a) {
  switch (a) {
    case DigestAlgo::kXxh3_128: return "xxh3-128";
    case DigestAlgo::kSha256: return "sha256";
  }
  return "xxh3-128";
}

Result<DigestAlgo> digest_algo_from_name(const std::string& name) {
  if (name == "xxh3-128") return DigestAlgo::kXxh3_128;
  if (name == "sha256") return DigestAlgo::kSha256;
  return Status::Error("UnknownDigest", "unknown digest algorithm '" + name.substr(0, 64) + "' (known: xxh3-128, sha256)");
}

size_t digest_hex_size(DigestAlgo a) { return a == DigestAlgo::kSha256 ? 64 : 32; }

bool is_digest_hex(DigestAlgo a, const std::string& hex) {
  if (hex.size() != digest_hex_size(a)) return false;
  for (char c : hex)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

std::string DigestValue::to_string() const { return std::string(digest_algo_name(algo)) + ":" + hex; }

Result<DigestValue> parse_digest(const std::string& text, const std::string& where) {
  const size_t colon = text.find(':');
  if (colon == std::string::npos)
    return Status::Error("BadField", where + ": digest '" + text.substr(0, 80) + "' must be \"<algorithm>:<hex>\" (e.g. xxh3-128:...)");
  auto algo = digest_algo_from_name(text.substr(0, colon));
  if (!algo.ok()) return Status::Error("UnknownDigest", where + ": " + algo.status().message());
  DigestValue v{*algo, text.substr(colon + 1)};
  if (!is_digest_hex(v.algo, v.hex))
    return Status::Error("BadField", where + ": " + digest_algo_name(v.algo) + " digest must be " +
                                         std::to_string(digest_hex_size(v.algo)) + " lower-case hex digits, got '" + v.hex.substr(0, 80) + "'");
  return v;
}

struct Digest::State {
  std::unique_ptr<Sha256> sha;  // when algo is kSha256
  XXH3_state_t* xxh = nullptr;  // when algo is kXxh3_128
  ~State() {
    if (xxh) XXH3_freeState(xxh);
  }
};

Digest::Digest(DigestAlgo algo) : algo_(algo), state_(std::make_unique<State>()) {
  if (algo_ == DigestAlgo::kSha256) {
    state_->sha = std::make_unique<Sha256>();
  } else {
    state_->xxh = XXH3_createState();
    if (!state_->xxh || XXH3_128bits_reset(state_->xxh) != XXH_OK) std::abort();
  }
}
Digest::~Digest() = default;
Digest::Digest(Digest&& o) noexcept : algo_(o.algo_), state_(std::move(o.state_)) {}
Digest& Digest::operator=(Digest&& o) noexcept {
  algo_ = o.algo_;
  state_ = std::move(o.state_);
  return *this;
}

void Digest::update(const void* data, size_t n) {
  if (n == 0) return;
  if (algo_ == DigestAlgo::kSha256) state_->sha->update(data, n);
  else xxh3_update(state_->xxh, data, n);
}

std::string Digest::hex_digest() {
  if (algo_ == DigestAlgo::kSha256) return state_->sha->hex_digest();
  const XXH128_hash_t h = XXH3_128bits_digest(state_->xxh);
  XXH3_128bits_reset(state_->xxh);
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, h);  // big-endian: high 64 bits first
  return hex_of(c.digest, sizeof c.digest);
}

DigestValue digest_of(DigestAlgo algo, const void* data, size_t n) {
  Digest d(algo);
  d.update(data, n);
  return d.value();
}

}  // namespace ckpt
