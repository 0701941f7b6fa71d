// Damaged stores: each case gives a clear error with its rule code and the documented `ckpt verify`
// exit code (README: 1 verification failed, 3 corrupt input, 4 not found, 5 unsupported): a
// flipped bit in a shard (verify names the tensor), a truncated or deleted shard, manifests with
// overlapping pieces, a gap, an out-of-bounds region, a wrong dtype or shape, an unknown version,
// invalid JSON, an unknown digest algorithm. Every case runs with both piece digests (xxh3-128,
// sha256); a version 1 manifest (the sha256 store rewritten to v1 form) still loads and verifies,
// and its flipped bits are still found. Structural rules are checked on manifests resealed with
// their manifest checksum (version 3); an edit not resealed is ManifestChecksumMismatch. HDF5
// storage that disagrees with the manifest (layout, filters, storage size, chunk shape) is a
// named corruption at open. A ckpt killed by a signal, or a sanitizer report (exit code 86, set here for the
// child, or its stderr marker), fails the test whatever the exit code.
#include "tests/formats/store/corruption_fixture.h"

namespace ckpt::store {
namespace corruption_test {

TEST_P(Corruption, CleanStoreVerifies) {
  auto dst = write("clean");
  const json m = manifest(dst);
  EXPECT_EQ(m["version"], ckpt::store::kFormatVersion);
  EXPECT_EQ(m["manifest_digest"].get<std::string>().rfind(std::string(digest_algo_name(GetParam())) + ":", 0), 0u) << m.dump();
  const std::string prefix = std::string(digest_algo_name(GetParam())) + ":";
  for (const auto& p : m["pieces"]) EXPECT_EQ(p["digest"].get<std::string>().rfind(prefix, 0), 0u) << p.dump();
  auto r = StoreReader::open(dst);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE((*r)->verify().ok());
  std::string out;
  EXPECT_EQ(ckpt_verify(dst, &out), 0);
  EXPECT_NE(out.find("ckpt-native v4"), std::string::npos) << out;
  EXPECT_NE(out.find(std::string("checked (") + digest_algo_name(GetParam()) + ")"), std::string::npos) << out;
}

// Flips one random bit in the data of every piece of `clean` in turn (a copy each) and checks that
// verify() and `ckpt verify` name exactly that piece, its tensor, file and dataset, and the
// algorithm of its digest.
void Corruption::expect_every_flip_found(const std::string& clean, const std::string& tag) {
  std::mt19937_64 rng(9);
  auto m = manifest(clean);
  for (size_t i = 0; i < m["pieces"].size(); ++i) {
    const std::string dst = dir_ + "/" + tag + std::to_string(i);
    std::filesystem::copy(clean, dst, std::filesystem::copy_options::recursive);
    const auto& p = m["pieces"][i];
    const std::string file = dst + "/" + p["file"].get<std::string>();
    auto [off, size] = data_extent(file, p["dataset"]);
    ASSERT_GT(size, 0u);
    flip_bit(file, off + rng() % size, static_cast<int>(rng() % 8));
    auto r = StoreReader::open(dst);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    auto rep = (*r)->verify(nullptr, 1 + static_cast<int>(i % 3));  // 1..3 hashing threads
    ASSERT_EQ(rep.failures.size(), 1u);
    EXPECT_EQ(rep.failures[0].piece, i);
    const Status& st = rep.failures[0].status;
    EXPECT_EQ(st.code(), "ChecksumMismatch");
    EXPECT_EQ(st.kind(), ErrorKind::kChecksum);
    EXPECT_EQ(st.tensor(), p["tensor"].get<std::string>());
    EXPECT_NE(st.message().find(p["dataset"].get<std::string>()), std::string::npos) << st.message();
    EXPECT_NE(st.file().find(p["file"].get<std::string>()), std::string::npos);
    EXPECT_NE(st.message().find(std::string(digest_algo_name(GetParam())) + " expected"), std::string::npos) << st.message();
    EXPECT_EQ(ckpt_verify(dst), 1);
  }
}

TEST_P(Corruption, FlippedBitInEveryPieceIsFoundAndNamed) { expect_every_flip_found(write("flip_src"), "flip"); }

// A version 1 manifest: "sha256": "<hex>" per piece, no "digest". The sha256 store rewritten so
// loads, verifies and still finds every flipped bit; the xxh3-128 one cannot be written as v1
// (its digests are not SHA-256): BadField.
TEST_P(Corruption, Version1ManifestStillReads) {
  const std::string dst = write("v1");
  json m = manifest(dst);
  m["version"] = 1;
  m.erase("manifest_digest");  // version 3's field
  for (auto& p : m["pieces"]) {
    const std::string d = p["digest"];
    p.erase("digest");
    p["sha256"] = d.substr(d.find(':') + 1);
  }
  put_manifest(dst, m.dump(1));
  if (GetParam() != DigestAlgo::kSha256) {
    EXPECT_EQ(open_status(dst).code(), "BadField");
    EXPECT_EQ(ckpt_verify(dst), 3);
    return;
  }
  auto r = StoreReader::open(dst);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ((*r)->manifest().version, 1);
  EXPECT_TRUE((*r)->verify().ok());
  std::string out;
  EXPECT_EQ(ckpt_verify(dst, &out), 0);
  EXPECT_NE(out.find("ckpt-native v1"), std::string::npos) << out;
  expect_every_flip_found(dst, "v1flip");
}

TEST_P(Corruption, FlippedBitInCompressedChunkFails) {
  auto dst = write("flipz", Codec::kShuffleZstd);
  auto m = manifest(dst);
  const auto& p = m["pieces"][0];
  const std::string file = dst + "/" + p["file"].get<std::string>();
  // Chunked: find the first chunk's address through the chunk index (H5Dget_chunk_info is
  // 1.10.5+); flip a byte in the middle of it.
  haddr_t addr;
  hsize_t csize;
  {
    auto lock = h5_lock();
    H5Id f = h5_file(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    H5Id d = h5_dataset(H5Dopen2(f.get(), p["dataset"].get<std::string>().c_str(), H5P_DEFAULT));
    H5Id sp = h5_space(H5Dget_space(d.get()));
    hsize_t offs[2];
    unsigned mask;
    ASSERT_GE(H5Dget_chunk_info(d.get(), sp.get(), 0, offs, &mask, &addr, &csize), 0);
  }
  flip_bit(file, addr + csize / 2, 3);
  auto r = StoreReader::open(dst);
  ASSERT_TRUE(r.ok());
  auto rep = (*r)->verify();
  ASSERT_EQ(rep.failures.size(), 1u);
  const Status& st = rep.failures[0].status;
  EXPECT_EQ(st.tensor(), p["tensor"].get<std::string>());
  // A chunk zstd cannot decode is corrupt input (3); one that decodes to other bytes fails its
  // checksum (1).
  EXPECT_EQ(ckpt_verify(dst), st.kind() == ErrorKind::kChecksum ? 1 : 3) << st.to_string();
}

TEST_P(Corruption, TruncatedShard) {
  auto dst = write("trunc");
  const std::string f = dst + "/shards/r00001.h5";
  std::filesystem::resize_file(f, std::filesystem::file_size(f) / 2);
  Status st = open_status(dst);
  EXPECT_EQ(st.code(), "BadShard") << st.to_string();
  EXPECT_NE(st.file().find("r00001.h5"), std::string::npos);
  EXPECT_EQ(ckpt_verify(dst), 3);
}

TEST_P(Corruption, DeletedShard) {
  auto dst = write("deleted");
  std::filesystem::remove(dst + "/shards/r00000.h5");
  Status st = open_status(dst);
  EXPECT_EQ(st.code(), "ShardMissing") << st.to_string();
  EXPECT_EQ(st.kind(), ErrorKind::kNotFound);
  EXPECT_EQ(ckpt_verify(dst), 4);
}

TEST_P(Corruption, ManifestRules) {
  auto clean = write("mf");
  const json good = manifest(clean);
  struct Edit {
    const char* code;
    std::function<void(json&)> apply;
    int exit = 3;  // corrupt input, unless the rule says otherwise
  };
  std::vector<Edit> edits = {
      {"PieceOverlap", [](json& j) { j["pieces"][1]["region"]["offset"] = {31, 0}; }},
      {"PieceGap",
       [](json& j) {
         j["pieces"][1]["region"]["offset"] = {33, 0}, j["pieces"][1]["region"]["extent"] = {31, 32}, j["pieces"][1]["bytes"] = 31 * 32 * 2;
       }},
      {"RegionOutOfBounds", [](json& j) { j["pieces"][1]["region"]["offset"] = {40, 0}; }},
      {"UnsupportedVersion", [](json& j) { j["version"] = 7; }, 5},
      {"BadByteCount", [](json& j) { j["pieces"][0]["dtype"] = "F32"; }},
      {"DTypeMismatch", [](json& j) { j["pieces"][0]["dtype"] = "I16"; }},  // same size, other HDF5 type
      {"ShapeMismatch",
       [](json& j) {  // consistent manifest, but the dataset holds 32x32 not 16x64
         j["tensors"][0]["shape"] = {32, 64};
         j["pieces"][0]["region"] = {{"offset", {0, 0}}, {"extent", {16, 64}}};
         j["pieces"][1]["region"] = {{"offset", {16, 0}}, {"extent", {16, 64}}};
       }},
      {"BadFileName", [](json& j) { j["pieces"][0]["file"] = "../escape.h5"; }},
      {"MissingDataset", [](json& j) { j["pieces"][0]["dataset"] = "/nope"; }},
      {"UnknownDigest", [](json& j) { j["pieces"][1]["digest"] = "md5:0123456789abcdef0123456789abcdef"; }, 5},
      {"BadField", [](json& j) { j["pieces"][1]["sha256"] = std::string(64, '0'); }},  // v1's field in v3
      {"ManifestChecksumMissing", [](json& j) { j.erase("manifest_digest"); }},
  };
  for (const auto& e : edits) {
    json j = good;
    e.apply(j);
    // Resealed: the rule itself must catch it (a writer's bug seals a bad manifest too).
    put_manifest(clean, (std::string(e.code) == "ManifestChecksumMissing" || std::string(e.code) == "UnsupportedVersion" ? j : resealed(j)).dump());
    Status st = open_status(clean);
    EXPECT_EQ(st.code(), e.code) << st.to_string();
    EXPECT_EQ(ckpt_verify(clean), e.exit) << e.code;
    if (std::string(e.code) == "ManifestChecksumMissing" || std::string(e.code) == "UnsupportedVersion") continue;
    // Not resealed: the manifest checksum finds the edit first (kind checksum, exit 1).
    put_manifest(clean, j.dump());
    st = open_status(clean);
    EXPECT_EQ(st.code(), "ManifestChecksumMismatch") << e.code << ": " << st.to_string();
    EXPECT_NE(st.file().find("manifest.json"), std::string::npos);
    EXPECT_EQ(ckpt_verify(clean), 1) << e.code;
  }
  put_manifest(clean, good.dump().substr(0, 100));
  EXPECT_EQ(open_status(clean).code(), "InvalidJson");
  EXPECT_EQ(ckpt_verify(clean), 3);
  put_manifest(clean, good.dump());
  EXPECT_TRUE(open_status(clean).ok());
}

INSTANTIATE_TEST_SUITE_P(Digests, Corruption, ::testing::Values(DigestAlgo::kXxh3_128, DigestAlgo::kSha256),
                         [](const ::testing::TestParamInfo<DigestAlgo>& i) {
                           return std::string(i.param == DigestAlgo::kSha256 ? "Sha256" : "Xxh3_128");
                         });

}  // namespace corruption_test
}  // namespace ckpt::store
