// formats/digest/digest.h: both algorithms against independent reference values (Python's
// hashlib.sha256 and xxhash.xxh3_128_hexdigest, and the published SHA-256 of "abc"), streaming in
// arbitrary splits equal to one shot, reuse after hex_digest(), the "<name>:<hex>" text form.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "formats/digest/digest.h"

namespace ckpt {
namespace {

// The 100000 bytes (i * 7 + 3) mod 256; their digests were printed by Python:
//   xxhash.xxh3_128_hexdigest(d), hashlib.sha256(d).hexdigest()
std::vector<unsigned char> pattern() {
  std::vector<unsigned char> d(100000);
  for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<unsigned char>((i * 7 + 3) % 256);
  return d;
}

TEST(Digest, KnownValues) {
  EXPECT_EQ(digest_of(DigestAlgo::kXxh3_128, "", 0).hex, "99aa06d3014798d86001c324468d497f");
  EXPECT_EQ(digest_of(DigestAlgo::kXxh3_128, "abc", 3).hex, "06b05ab6733a618578af5f94892f3950");
  EXPECT_EQ(digest_of(DigestAlgo::kSha256, "abc", 3).hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  auto d = pattern();
  EXPECT_EQ(digest_of(DigestAlgo::kXxh3_128, d.data(), d.size()).hex, "d9e155dd16e141d00c056f6fcc340974");
  EXPECT_EQ(digest_of(DigestAlgo::kSha256, d.data(), d.size()).hex, "d96bab6a55ee326ba206dd4a85a6e95e14360d7fabbf448f03e689c24382b7d0");
}

TEST(Digest, StreamingInAnySplitEqualsOneShotAndResets) {
  auto d = pattern();
  std::mt19937_64 rng(3);
  for (DigestAlgo a : {DigestAlgo::kXxh3_128, DigestAlgo::kSha256}) {
    const DigestValue whole = digest_of(a, d.data(), d.size());
    Digest h(a);
    for (int round = 0; round < 3; ++round) {  // the same object again: hex_digest() resets it
      size_t at = 0;
      while (at < d.size()) {
        size_t n = std::min<size_t>(d.size() - at, rng() % 5000);
        h.update(d.data() + at, n);
        at += n;
      }
      EXPECT_EQ(h.value(), whole) << digest_algo_name(a);
    }
    Digest moved = std::move(h);
    moved.update(d.data(), d.size());
    EXPECT_EQ(moved.value(), whole);
  }
}

TEST(Digest, TextForm) {
  DigestValue v{DigestAlgo::kXxh3_128, std::string(32, 'f')};
  EXPECT_EQ(v.to_string(), "xxh3-128:" + std::string(32, 'f'));
  auto back = parse_digest(v.to_string(), "piece");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, v);
  EXPECT_EQ(parse_digest("sha1:" + std::string(40, '0'), "piece").status().code(), "UnknownDigest");
  EXPECT_EQ(parse_digest("sha256", "piece").status().code(), "BadField");
  EXPECT_EQ(digest_algo_from_name("crc32c").status().code(), "UnknownDigest");
  EXPECT_EQ(digest_hex_size(DigestAlgo::kSha256), 64u);
  EXPECT_TRUE(is_digest_hex(DigestAlgo::kXxh3_128, std::string(32, '0')));
  EXPECT_FALSE(is_digest_hex(DigestAlgo::kXxh3_128, std::string(64, '0')));
}

}  // namespace
}  // namespace ckpt
