// The store's own chunk codec against HDF5's filter pipeline (the reference): a dataset written
// through H5Dwrite with the shuffle and zstd filters holds, chunk for chunk, exactly the bytes
// encode_chunk makes, and decode_chunk inverts them; the chunk grid against a naive unravel of
// every element's coordinates.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "formats/store/chunk_codec.h"
#include "formats/store/h5/h5_handles.h"
#include "formats/store/h5/h5_types.h"
#include "formats/store/h5/zstd_filter.h"
#include "tests/temp_dir.h"

namespace ckpt::store {
namespace {

std::vector<hsize_t> unravel(uint64_t e, const std::vector<hsize_t>& dims) {
  std::vector<hsize_t> idx(dims.size());
  for (size_t d = dims.size(); d-- > 0;) {
    idx[d] = e % dims[d];
    e /= dims[d];
  }
  return idx;
}

TEST(ChunkGrid, EveryElementInTheChunkHoldingItsCoordinates) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<hsize_t> dims(1 + rng() % 4);
    uint64_t n = 1;
    for (auto& d : dims) n *= (d = 1 + rng() % 7);
    const size_t esize = 1u << (rng() % 3);
    const auto chunk = piece_chunk_dims(dims, esize, 1 + rng() % 64);
    const ChunkGrid g = ChunkGrid::of(dims, chunk);
    uint64_t covered = 0;
    for (uint64_t c = 0; c < g.num_chunks; ++c) covered += g.valid(c);
    ASSERT_EQ(covered, n);
    for (uint64_t e = 0; e < n; ++e) {
      const uint64_t c = g.chunk_of(e);
      ASSERT_LT(c, g.num_chunks);
      ASSERT_LE(g.first(c), e);
      ASSERT_LT(e, g.first(c) + g.valid(c));
      const auto idx = unravel(e, dims), off = g.offset(c);
      for (size_t d = 0; d < dims.size(); ++d) {
        ASSERT_LE(off[d], idx[d]);
        ASSERT_LT(idx[d], off[d] + chunk[d]) << "element " << e << " dim " << d;
      }
    }
  }
}

class ChunkCodecVsHdf5 : public ::testing::TestWithParam<Codec> {};

TEST_P(ChunkCodecVsHdf5, StoredChunksEqualTheFilterPipelines) {
  ASSERT_TRUE(register_zstd_filter().ok());
  const Codec codec = GetParam();
  const auto tmp = testing::fresh_temp_dir("chunk_codec");
  std::mt19937 rng(11);
  for (int trial = 0; trial < 12; ++trial) {
    std::vector<hsize_t> dims = {static_cast<hsize_t>(3 + rng() % 40), static_cast<hsize_t>(1 + rng() % 30)};
    const DType dt = trial % 3 == 0 ? DType::kBF16 : trial % 3 == 1 ? DType::kF32 : DType::kU8;
    const size_t es = dtype_size(dt);
    const auto chunk = piece_chunk_dims(dims, es, 16 + rng() % 300);
    std::vector<unsigned char> data(dims[0] * dims[1] * es);
    for (auto& b : data) b = static_cast<unsigned char>(rng() % 7);  // compressible
    auto lock = h5_lock();
    const std::string path = (tmp / ("t" + std::to_string(trial) + ".h5")).string();
    H5Id f = h5_file(H5Fcreate(path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT));
    H5Id space = h5_space(H5Screate_simple(2, dims.data(), nullptr));
    H5Id dcpl = h5_plist(H5Pcreate(H5P_DATASET_CREATE));
    H5Pset_chunk(dcpl.get(), 2, chunk.data());
    if (codec == Codec::kShuffleZstd && es > 1) H5Pset_shuffle(dcpl.get());
    unsigned level[1] = {1};
    ASSERT_GE(H5Pset_filter(dcpl.get(), kZstdFilterId, H5Z_FLAG_MANDATORY, 1, level), 0);
    H5Id ds = h5_dataset(H5Dcreate2(f.get(), "/d", h5_type_for(dt), space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
    ASSERT_GE(H5Dwrite(ds.get(), h5_type_for(dt), H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()), 0);
    const ChunkGrid g = ChunkGrid::of(dims, chunk);
    for (uint64_t c = 0; c < g.num_chunks; ++c) {
      // The chunk's data as HDF5 stores it: the valid rows, then zeros (the fill value).
      std::vector<unsigned char> plain(g.chunk_elems() * es, 0);
      std::copy(data.begin() + static_cast<long>(g.first(c) * es), data.begin() + static_cast<long>((g.first(c) + g.valid(c)) * es), plain.begin());
      auto ours = encode_chunk(codec, 1, es, plain.data(), plain.size());
      ASSERT_TRUE(ours.ok());
      const auto off = g.offset(c);
      hsize_t n = 0;
      ASSERT_GE(H5Dget_chunk_storage_size(ds.get(), off.data(), &n), 0);
      std::string theirs(n, '\0');
      uint32_t mask = 1;
      ASSERT_GE(H5Dread_chunk(ds.get(), H5P_DEFAULT, off.data(), &mask, theirs.data()), 0);
      EXPECT_EQ(mask, 0u);
      EXPECT_EQ(*ours, theirs) << "trial " << trial << " chunk " << c;
      std::vector<unsigned char> back(plain.size());
      ASSERT_TRUE(decode_chunk(codec, es, theirs.data(), theirs.size(), back.data(), back.size()).ok());
      EXPECT_EQ(back, plain);
    }
  }
  std::filesystem::remove_all(tmp);
}

INSTANTIATE_TEST_SUITE_P(Codecs, ChunkCodecVsHdf5, ::testing::Values(Codec::kZstd, Codec::kShuffleZstd));

TEST(ChunkCodec, DecodeRefusesGarbageAndWrongSizes) {
  std::vector<unsigned char> plain(100, 3), out(100);
  auto enc = encode_chunk(Codec::kZstd, 1, 1, plain.data(), plain.size());
  ASSERT_TRUE(enc.ok());
  EXPECT_EQ(decode_chunk(Codec::kZstd, 1, enc->data(), enc->size(), out.data(), 99).code(), "ChunkCorrupt");
  std::string bad = *enc;
  bad[bad.size() - 1] ^= 1;  // the frame checksum
  EXPECT_EQ(decode_chunk(Codec::kZstd, 1, bad.data(), bad.size(), out.data(), out.size()).code(), "ChunkCorrupt");
  EXPECT_EQ(decode_chunk(Codec::kZstd, 1, "nonsense", 8, out.data(), out.size()).code(), "ChunkCorrupt");
}

}  // namespace
}  // namespace ckpt::store
