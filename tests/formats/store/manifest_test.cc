// Manifest parsing and the structural validator: one test per rule code, per rule of the version
// 2 digest field (and of version 1's sha256 field, still read), and per rule of version 3's
// manifest checksum ("manifest_digest").
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstdio>
#include <functional>

#include "formats/store/manifest.h"
#include "tests/test_cases.h"

namespace ckpt::store {
namespace {

using nlohmann::json;

json piece(const std::string& t, std::vector<int64_t> off, std::vector<int64_t> ext, const std::string& ds,
           std::optional<std::pair<int64_t, int64_t>> flat = std::nullopt) {
  int64_t n = 1;
  for (auto e : ext) n *= e;
  json region = {{"offset", off}, {"extent", ext}};
  if (flat) {
    region["flat"] = {flat->first, flat->second};
    n = flat->second - flat->first;
  }
  return {{"tensor", t}, {"file", "shards/r00000.h5"}, {"dataset", ds}, {"region", region}, {"dtype", "F32"},
          {"bytes", n * 4}, {"digest", "xxh3-128:" + std::string(32, 'a')}, {"codec", "none"}};
}

json good() {
  return {{"format", "ckpt-native"},
          {"version", 2},
          {"layout", {{"tp", 2}}},
          {"tensors", {{{"name", "w"}, {"dtype", "F32"}, {"shape", {4, 6}}}}},
          {"pieces", {piece("w", {0, 0}, {4, 3}, "/p0"), piece("w", {0, 3}, {4, 3}, "/p1")}}};
}

Status check(const json& j) {
  auto m = parse_manifest(j.dump());
  if (!m.ok()) return m.status();
  return validate_manifest(*m);
}

TEST(Manifest, GoodParsesAndRoundTrips) {
  auto m = parse_manifest(good().dump());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_TRUE(validate_manifest(*m).ok());
  EXPECT_EQ(m->metadata["layout"]["tp"], 2);
  auto again = parse_manifest(manifest_to_json(*m).dump());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->pieces, m->pieces);
  EXPECT_EQ(again->tensors, m->tensors);
}

TEST(Manifest, InvalidJson) {
  auto m = parse_manifest("{\"format\": ");
  EXPECT_EQ(m.status().code(), "InvalidJson");
  EXPECT_EQ(m.status().kind(), ErrorKind::kCorruption);
}

TEST(Manifest, UnknownVersion) {
  for (int v : {0, 5, -1}) {
    json j = good();
    j["version"] = v;
    EXPECT_EQ(check(j).code(), "UnsupportedVersion") << v;
    EXPECT_EQ(check(j).kind(), ErrorKind::kUnsupported);
  }
  json j = good();
  j["version"] = UINT64_MAX;
  EXPECT_EQ(check(j).code(), "UnsupportedVersion");
}

// The same manifest in version 1 form: "sha256": "<hex>" on every piece.
json good_v1() {
  json j = good();
  j["version"] = 1;
  for (auto& p : j["pieces"]) {
    p.erase("digest");
    p["sha256"] = std::string(64, 'b');
  }
  return j;
}

TEST(Manifest, Version1Sha256IsReadAsSha256Digest) {
  auto m = parse_manifest(good_v1().dump());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_TRUE(validate_manifest(*m).ok());
  EXPECT_EQ(m->version, 1);
  EXPECT_EQ(m->pieces[0].digest.algo, DigestAlgo::kSha256);
  EXPECT_EQ(m->pieces[0].digest.hex, std::string(64, 'b'));
  // Written back, it is a version 4 manifest with "digest": "sha256:<hex>".
  json out = manifest_to_json(*m);
  EXPECT_EQ(out["version"], kFormatVersion);
  EXPECT_EQ(out["pieces"][0]["digest"], "sha256:" + std::string(64, 'b'));
  EXPECT_FALSE(out["pieces"][0].contains("sha256"));
  auto again = parse_manifest(out.dump());
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(again->pieces, m->pieces);
}

TEST(Manifest, Version2TakesBothAlgorithmsPerPiece) {
  json j = good();
  j["pieces"][1]["digest"] = "sha256:" + std::string(64, 'c');
  auto m = parse_manifest(j.dump());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->pieces[0].digest, (DigestValue{DigestAlgo::kXxh3_128, std::string(32, 'a')}));
  EXPECT_EQ(m->pieces[1].digest, (DigestValue{DigestAlgo::kSha256, std::string(64, 'c')}));
}

TEST(Manifest, Version2WithSha256FieldIsBadField) {
  json j = good();
  j["pieces"][0]["sha256"] = std::string(64, 'a');
  EXPECT_EQ(check(j).code(), "BadField");
  EXPECT_EQ(check(j).tensor(), "w");
  j = good();
  j["pieces"][0].erase("digest");
  j["pieces"][0]["sha256"] = std::string(64, 'a');
  EXPECT_EQ(check(j).code(), "BadField") << check(j).to_string();
}

TEST(Manifest, Version1WithDigestFieldIsBadField) {
  json j = good_v1();
  j["pieces"][0]["digest"] = "sha256:" + std::string(64, 'b');
  EXPECT_EQ(check(j).code(), "BadField");
  j = good_v1();
  j["pieces"][0].erase("sha256");
  j["pieces"][0]["digest"] = "sha256:" + std::string(64, 'b');
  EXPECT_EQ(check(j).code(), "BadField");
  j = good_v1();
  j["pieces"][0]["sha256"] = std::string(32, 'b');  // an xxh3-128-sized hex is not a sha256
  EXPECT_EQ(check(j).code(), "BadField");
}

TEST(Manifest, UnknownDigestAlgorithm) {
  for (const char* text : {"md5:0123456789abcdef0123456789abcdef", "XXH3-128:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "blake2b:00", ":aa"}) {
    json j = good();
    j["pieces"][1]["digest"] = text;
    Status st = check(j);
    EXPECT_EQ(st.code(), "UnknownDigest") << text << ": " << st.to_string();
    EXPECT_EQ(st.kind(), ErrorKind::kUnsupported);
    EXPECT_EQ(st.tensor(), "w");
  }
}

TEST(Manifest, MalformedDigestIsBadField) {
  for (const std::string& text : {std::string(32, 'a'),                     // no algorithm
                                  "xxh3-128:" + std::string(64, 'a'),       // a sha256-sized hex
                                  "sha256:" + std::string(32, 'a'),         // an xxh3-128-sized hex
                                  "xxh3-128:" + std::string(32, 'A'),       // upper case
                                  "xxh3-128:" + std::string(31, 'a') + "g", // not hex
                                  "xxh3-128:" + std::string(32, 'a') + " "}) {
    json j = good();
    j["pieces"][0]["digest"] = text;
    EXPECT_EQ(check(j).code(), "BadField") << text;
  }
  json j = good();
  j["pieces"][0]["digest"] = 7;
  EXPECT_EQ(check(j).code(), "BadField");
  j["pieces"][0].erase("digest");
  EXPECT_EQ(check(j).code(), "BadField");
}

TEST(Manifest, ValidatorChecksInMemoryDigests) {
  auto m = parse_manifest(good().dump());
  ASSERT_TRUE(m.ok());
  m->pieces[0].digest.hex = "abc";
  EXPECT_EQ(validate_manifest(*m).code(), "BadField");
  m = parse_manifest(good().dump());
  m->version = 1;  // version 1 knows only sha256
  EXPECT_EQ(validate_manifest(*m).code(), "BadField");
}

TEST(Manifest, GatheredRecordsUseTheCurrentForm) {
  json rec = json::parse(piece("w", {0, 0}, {4, 3}, "/p0").dump());  // as gathered: text
  auto r = piece_record_from_json(rec);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(piece_record_to_json(*r), rec);
  rec.erase("digest");
  rec["sha256"] = std::string(64, 'a');
  EXPECT_EQ(piece_record_from_json(rec).status().code(), "BadField");
  EXPECT_TRUE(piece_record_from_json(rec, 1).ok());
}

TEST(Manifest, UnknownFormat) {
  json j = good();
  j["format"] = "other";
  EXPECT_EQ(check(j).code(), "UnknownFormat");
}

TEST(Manifest, WrongTypes) {
  json j = good();
  j["pieces"][0]["bytes"] = "48";
  EXPECT_EQ(check(j).code(), "BadField");
  j = good();
  j["tensors"][0]["shape"] = {4, -6};
  EXPECT_EQ(check(j).code(), "BadField");
  j = good();
  j["pieces"][0]["digest"] = "xyz";
  EXPECT_EQ(check(j).code(), "BadField");
}

TEST(Manifest, Overlap) {
  json j = good();
  j["pieces"][1] = piece("w", {0, 2}, {4, 4}, "/p1");
  j["pieces"].push_back(piece("w", {0, 0}, {0, 0}, "/p2"));
  Status s = check(j);
  EXPECT_EQ(s.code(), "PieceOverlap") << s.to_string();
  EXPECT_EQ(s.tensor(), "w");
}

TEST(Manifest, Gap) {
  json j = good();
  j["pieces"][1] = piece("w", {0, 3}, {3, 3}, "/p1");
  Status s = check(j);
  EXPECT_EQ(s.code(), "PieceGap") << s.to_string();
}

TEST(Manifest, OutOfBounds) {
  json j = good();
  j["pieces"][1] = piece("w", {0, 3}, {4, 4}, "/p1");
  EXPECT_EQ(check(j).code(), "RegionOutOfBounds");
  j = good();
  j["pieces"][1] = piece("w", {0, 3}, {4, 3}, "/p1", std::make_pair<int64_t, int64_t>(0, 13));
  EXPECT_EQ(check(j).code(), "RegionOutOfBounds");
  j = good();
  j["pieces"][1]["region"]["offset"] = {0, 3, 0};
  j["pieces"][1]["region"]["extent"] = {4, 3, 1};
  EXPECT_EQ(check(j).code(), "RegionOutOfBounds");
  j = good();  // offset + extent overflows int64
  j["pieces"][1]["region"]["offset"] = {0, INT64_MAX};
  EXPECT_EQ(check(j).code(), "RegionOutOfBounds");
}

TEST(Manifest, PiecesPerTensorAreBounded) {
  // kMaxPiecesPerTensor + 1 flat pieces of one element each tile a [1, n] tensor exactly: refused
  // by their number before the tiling is checked.
  const int64_t n = static_cast<int64_t>(kMaxPiecesPerTensor) + 1;
  std::vector<TensorMeta> tensors{{"w", DType::kF32, {1, n}}};
  std::vector<Piece> pieces;
  for (int64_t i = 0; i < n; ++i) pieces.push_back({"w", Region{Box{{0, i}, {1, 1}}}, DType::kF32});
  EXPECT_EQ(validate_pieces(tensors, pieces).code(), "TooManyPieces");
  pieces.pop_back();
  pieces.back().region.box.extent[1] = 2;  // the bound itself is allowed
  EXPECT_TRUE(validate_pieces(tensors, pieces).ok()) << validate_pieces(tensors, pieces).to_string();
}

TEST(Manifest, FlatPiecesTile) {
  json j = good();
  j["pieces"][1] = piece("w", {0, 3}, {4, 3}, "/p1", std::make_pair<int64_t, int64_t>(0, 5));
  j["pieces"].push_back(piece("w", {0, 3}, {4, 3}, "/p2", std::make_pair<int64_t, int64_t>(5, 12)));
  EXPECT_TRUE(check(j).ok()) << check(j).to_string();
  j["pieces"][2] = piece("w", {0, 3}, {4, 3}, "/p2", std::make_pair<int64_t, int64_t>(6, 12));
  EXPECT_EQ(check(j).code(), "FlatRangeGap");
  j["pieces"][2] = piece("w", {0, 3}, {4, 3}, "/p2", std::make_pair<int64_t, int64_t>(4, 12));
  EXPECT_EQ(check(j).code(), "PieceOverlap");
}

TEST(Manifest, FileNamesAndDuplicates) {
  for (const char* bad : {"../x.h5", "/etc/passwd", "shards/../../x", "", "a//b", "./a"}) {
    json j = good();
    j["pieces"][0]["file"] = bad;
    EXPECT_EQ(check(j).code(), "BadFileName") << bad;
  }
  json j = good();
  j["pieces"][1]["dataset"] = "/p0";
  EXPECT_EQ(check(j).code(), "DuplicateDataset");
  j = good();
  j["tensors"].push_back(j["tensors"][0]);
  EXPECT_EQ(check(j).code(), "DuplicateTensor");
  j = good();
  j["pieces"][0]["tensor"] = "nope";
  EXPECT_EQ(check(j).code(), "UnknownTensor");
  j = good();
  j["pieces"][0]["bytes"] = 47;
  EXPECT_EQ(check(j).code(), "BadByteCount");
  j = good();
  j["pieces"][0]["dtype"] = "F33";
  EXPECT_EQ(check(j).code(), "UnknownDType");
}

TEST(Manifest, ManyColumnPiecesAreFast) {
  // 20000 width-1 column pieces: the sweep must pick dim 1 (not O(n^2) along dim 0).
  json j = good();
#if defined(CKPT_TEST_SANITIZED)
  constexpr int kColumns = 5000;  // under ASan: memory errors; the optimized build checks the speed
#else
  constexpr int kColumns = 20000;
#endif
  j["tensors"][0]["shape"] = {8, kColumns};
  j["pieces"] = json::array();
  for (int c = 0; c < kColumns; ++c) j["pieces"].push_back(piece("w", {0, c}, {8, 1}, "/p" + std::to_string(c)));
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(check(j).ok());
  // O(n^2) would be 2e8 box intersections: ~8 s optimized, minutes under ASan + UBSan (Debug), whose
  // O(n log n) run alone takes ~10 s on a loaded 2-core machine.
#if defined(CKPT_TEST_SANITIZED)
  constexpr double kMaxSeconds = 60.0;
#else
  constexpr double kMaxSeconds = 5.0;
#endif
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), kMaxSeconds);
}

TEST(Manifest, SafeRelativePath) {
  EXPECT_TRUE(is_safe_relative_path("shards/r00001.h5"));
  EXPECT_FALSE(is_safe_relative_path("shards/.."));
  EXPECT_FALSE(is_safe_relative_path("shards/"));
}

// --- Version 3: the manifest checksum -------------------------------------------------------

// XXH3-128 of `text` in canonical (big-endian) hex, straight from libxxhash: the reference the
// tests hold the store's digest code to.
std::string xxh3_hex(const std::string& text) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits(text.data(), text.size()));
  std::string hex;
  char b[3];
  for (unsigned char x : c.digest) std::snprintf(b, sizeof b, "%02x", x), hex += b;
  return hex;
}

// good() as the version 3 writer writes it: through manifest_to_json.
json sealed(DigestAlgo algo = DigestAlgo::kXxh3_128) {
  auto m = parse_manifest(good().dump());
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  m->manifest_digest.algo = algo;
  return manifest_to_json(*m);
}

TEST(ManifestChecksum, CanonicalTextIsSortedCompactAndOmitsTheChecksum) {
  const json j = json::parse(R"({"version": 3, "b": [1, 2.5, 1e-05, "x\u00e9"], "a": {"z": null, "y": true},
                                 "manifest_digest": "xxh3-128:00000000000000000000000000000000"})");
  EXPECT_EQ(canonical_manifest_text(j), "{\"a\":{\"y\":true,\"z\":null},\"b\":[1,2.5,1e-05,\"x\xc3\xa9\"],\"version\":3}");
}

TEST(ManifestChecksum, WriterSealsVersion3WithTheDigestOfTheCanonicalText) {
  const json out = sealed();
  EXPECT_EQ(out["version"], kFormatVersion);
  ASSERT_TRUE(out.contains("manifest_digest"));
  json rest = out;
  rest.erase("manifest_digest");
  EXPECT_EQ(out["manifest_digest"], "xxh3-128:" + xxh3_hex(rest.dump()));
  auto back = parse_manifest(out.dump(1));  // whitespace is not part of the canonical text
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->version, kFormatVersion);
  EXPECT_EQ(back->manifest_digest.to_string(), out["manifest_digest"]);
  EXPECT_TRUE(validate_manifest(*back).ok());
  EXPECT_FALSE(back->metadata.contains("manifest_digest"));  // a format key, not metadata
  // sha256 when the writer asks for it (the pieces' algorithm)
  const json s = sealed(DigestAlgo::kSha256);
  EXPECT_EQ(s["manifest_digest"].get<std::string>().rfind("sha256:", 0), 0u);
  EXPECT_TRUE(parse_manifest(s.dump()).ok());
}

TEST(ManifestChecksum, EveryFieldIsCovered) {
  const std::vector<std::pair<const char*, std::function<void(json&)>>> edits = {
      {"piece dtype", [](json& j) { j["pieces"][0]["dtype"] = "I32"; }},  // same size: only the checksum sees it
      {"tensor dtype", [](json& j) { j["tensors"][0]["dtype"] = "I32"; }},
      {"tensor shape", [](json& j) { j["tensors"][0]["shape"] = {6, 4}; }},
      {"region", [](json& j) { j["pieces"][0]["region"]["offset"] = {0, 1}; }},
      {"codec", [](json& j) { j["pieces"][0]["codec"] = "zstd", j["pieces"][0]["codec_level"] = 1; }},
      {"file", [](json& j) { j["pieces"][0]["file"] = "shards/r00001.h5"; }},
      {"dataset", [](json& j) { j["pieces"][0]["dataset"] = "/p9"; }},
      {"bytes", [](json& j) { j["pieces"][0]["bytes"] = 40; }},
      {"piece digest", [](json& j) { j["pieces"][0]["digest"] = "xxh3-128:" + std::string(32, 'b'); }},
      {"metadata", [](json& j) { j["layout"]["tp"] = 4; }},
      {"new key", [](json& j) { j["model_config"] = {{"num_hidden_layers", 1000000000}}; }},
      {"piece order", [](json& j) { std::swap(j["pieces"][0], j["pieces"][1]); }},
  };
  for (const auto& [what, edit] : edits) {
    json j = sealed();
    edit(j);
    auto m = parse_manifest(j.dump());
    ASSERT_FALSE(m.ok()) << what;
    EXPECT_EQ(m.status().code(), "ManifestChecksumMismatch") << what << ": " << m.status().to_string();
    EXPECT_EQ(m.status().kind(), ErrorKind::kChecksum) << what;
    EXPECT_NE(m.status().message().find("expected"), std::string::npos) << m.status().message();
  }
}

TEST(ManifestChecksum, MissingIsNamed) {
  json j = sealed();
  j.erase("manifest_digest");
  auto m = parse_manifest(j.dump());
  EXPECT_EQ(m.status().code(), "ManifestChecksumMissing");
  EXPECT_EQ(m.status().kind(), ErrorKind::kCorruption);
}

TEST(ManifestChecksum, MalformedOrUnknownAlgorithm) {
  for (const json& bad : {json(5), json("xxh3-128"), json("xxh3-128:ABC"), json("xxh3-128:" + std::string(31, 'a'))}) {
    json j = sealed();
    j["manifest_digest"] = bad;
    EXPECT_EQ(parse_manifest(j.dump()).status().code(), "BadField") << bad.dump();
  }
  json j = sealed();
  j["manifest_digest"] = "md5:" + std::string(32, 'a');
  EXPECT_EQ(parse_manifest(j.dump()).status().code(), "UnknownDigest");
}

TEST(ManifestChecksum, NotAllowedBeforeVersion3) {
  // A v2 or v1 manifest never had the field: one that has it was made by something else.
  json j = good();
  j["manifest_digest"] = "xxh3-128:" + std::string(32, 'a');
  EXPECT_EQ(check(j).code(), "BadField");
  j = good_v1();
  j["manifest_digest"] = "xxh3-128:" + std::string(32, 'a');
  EXPECT_EQ(check(j).code(), "BadField");
  // without it, versions 1 and 2 read: they carry no manifest checksum to check
  auto m = parse_manifest(good().dump());
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->version, 2);
  EXPECT_TRUE(m->manifest_digest.hex.empty());
}

TEST(ManifestChecksum, VersionIsCheckedFirstAndRulesStillApplyToSealedManifests) {
  json j = sealed();
  j["version"] = 5;  // an unknown version is not judged by this version's checksum
  EXPECT_EQ(parse_manifest(j.dump()).status().code(), "UnsupportedVersion");
  // A sealed manifest that breaks a structural rule (a writer's bug) is still refused by the rule.
  auto m = parse_manifest(good().dump());
  ASSERT_TRUE(m.ok());
  m->pieces[1].piece.region.box.offset = {0, 2};
  auto back = parse_manifest(manifest_to_json(*m).dump());
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(validate_manifest(*back).code(), "PieceOverlap");
}

TEST(ManifestChecksum, MetadataKeyIsReserved) { EXPECT_TRUE(is_reserved_key("manifest_digest")); }

}  // namespace
}  // namespace ckpt::store
