// HDF5 storage that disagrees with the manifest is a named corruption at open (layout, filters,
// storage size, chunk shape), and a relabelled dtype is the manifest checksum's: run with both
// piece digests on the Corruption fixture's store (corruption_fixture.h).
#include "tests/formats/store/corruption_fixture.h"

namespace ckpt::store {
namespace corruption_test {

class StoreStorage : public Corruption {};

// A relabelled dtype of the same size (BF16 -> F16, both stored as 16-bit words) passes every
// structural rule; only the manifest checksum finds it.
TEST_P(StoreStorage, RelabelledDtypeIsChecksumMismatch) {
  auto dst = write("relabel");
  json j = manifest(dst);
  for (auto& p : j["pieces"])
    if (p["dtype"] == "BF16") p["dtype"] = "F16";
  for (auto& t : j["tensors"])
    if (t["dtype"] == "BF16") t["dtype"] = "F16";
  put_manifest(dst, j.dump(1));
  Status st = open_status(dst);
  EXPECT_EQ(st.code(), "ManifestChecksumMismatch") << st.to_string();
  EXPECT_EQ(st.kind(), ErrorKind::kChecksum);
  EXPECT_EQ(ckpt_verify(dst), 1);
  put_manifest(dst, resealed(j).dump(1));  // the same edit, resealed: opens (the bytes are 16-bit words either way)
  EXPECT_TRUE(open_status(dst).ok());
}

// HDF5 metadata that disagrees with the manifest: named at open, never a slower read path.
TEST_P(StoreStorage, StorageSizeInLayoutMessageIsNamed) {
  auto dst = write("size");
  const json m = manifest(dst);
  const auto& p = m["pieces"][0];  // up_proj rows 0..31, 2048 bytes, contiguous
  const std::string file = dst + "/" + p["file"].get<std::string>();
  auto [addr, size] = data_extent(file, p["dataset"]);
  ASSERT_EQ(size, p["bytes"].get<uint64_t>());
  // The layout message holds the data address then its size, 8 bytes each, little-endian.
  std::string bytes = testing::read_file_bytes(file);
  std::string needle(16, '\0');
  for (int b = 0; b < 8; ++b) needle[b] = static_cast<char>(addr >> (8 * b)), needle[8 + b] = static_cast<char>(size >> (8 * b));
  const size_t at = bytes.find(needle);
  ASSERT_NE(at, std::string::npos);
  ASSERT_EQ(bytes.find(needle, at + 1), std::string::npos);
  const uint64_t lower = size - 768;
  for (int b = 0; b < 8; ++b) bytes[at + 8 + b] = static_cast<char>(lower >> (8 * b));
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
  Status st = open_status(dst);
  EXPECT_EQ(st.code(), "StorageSizeMismatch") << st.to_string();
  EXPECT_EQ(st.tensor(), p["tensor"].get<std::string>());
  EXPECT_NE(st.message().find(std::to_string(lower) + " bytes, expected " + std::to_string(size)), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(p["dataset"].get<std::string>()), std::string::npos) << st.message();
  EXPECT_EQ(ckpt_verify(dst), 3);
}

TEST_P(StoreStorage, ChunkedDatasetForCodecNoneIsLayoutMismatch) {
  auto dst = write("layout");
  const json m = manifest(dst);
  const auto& p = m["pieces"][0];
  rewrite_dataset(dst + "/" + p["file"].get<std::string>(), p["dataset"], [](hid_t dcpl) {
    const hsize_t chunk[2] = {8, 32};
    H5Pset_chunk(dcpl, 2, chunk);
  });
  Status st = open_status(dst);
  EXPECT_EQ(st.code(), "LayoutMismatch") << st.to_string();
  EXPECT_NE(st.message().find("chunked, expected contiguous"), std::string::npos) << st.message();
  EXPECT_EQ(ckpt_verify(dst), 3);
}

TEST_P(StoreStorage, CompressedDatasetRules) {
  struct Case {
    const char* code;
    const char* words;
    std::function<void(hid_t)> dcpl;
  };
  const unsigned level[1] = {1};
  const std::vector<Case> cases = {
      {"LayoutMismatch", "contiguous, expected chunked", [](hid_t dcpl) { H5Pset_layout(dcpl, H5D_CONTIGUOUS); }},
      {"FilterMismatch", "expected [shuffle (2), zstd (32015)]",  // zstd without the shuffle the codec names
       [&](hid_t dcpl) {
         const hsize_t chunk[2] = {16, 32};
         H5Pset_chunk(dcpl, 2, chunk);
         H5Pset_filter(dcpl, kZstdFilterId, H5Z_FLAG_MANDATORY, 1, level);
       }},
      {"ChunkShapeMismatch", "chunk dims [32, 16]",  // not whole rows: not the writer's chunking
       [&](hid_t dcpl) {
         const hsize_t chunk[2] = {32, 16};
         H5Pset_chunk(dcpl, 2, chunk);
         H5Pset_shuffle(dcpl);
         H5Pset_filter(dcpl, kZstdFilterId, H5Z_FLAG_MANDATORY, 1, level);
       }},
  };
  for (const auto& c : cases) {
    auto dst = write(std::string("z_") + c.code, Codec::kShuffleZstd);
    const json m = manifest(dst);
    const auto& p = m["pieces"][0];  // BF16 up_proj rows, shuffle+zstd
    ASSERT_EQ(p["codec"], "shuffle+zstd");
    rewrite_dataset(dst + "/" + p["file"].get<std::string>(), p["dataset"], c.dcpl);
    Status st = open_status(dst);
    EXPECT_EQ(st.code(), c.code) << st.to_string();
    EXPECT_NE(st.message().find(c.words), std::string::npos) << st.message();
    EXPECT_EQ(st.tensor(), p["tensor"].get<std::string>());
    EXPECT_EQ(ckpt_verify(dst), 3) << c.code;
  }
}

INSTANTIATE_TEST_SUITE_P(Digests, StoreStorage, ::testing::Values(DigestAlgo::kXxh3_128, DigestAlgo::kSha256),
                         [](const ::testing::TestParamInfo<DigestAlgo>& i) {
                           return std::string(i.param == DigestAlgo::kSha256 ? "Sha256" : "Xxh3_128");
                         });

}  // namespace corruption_test
}  // namespace ckpt::store
