// Compressed stores with chunks encoded and decoded on thread pools (formats/store/chunk_writer.h,
// chunk_reader.h):
// - writes with 1 and 3 compression threads, whole pieces or odd slabs, give identical stored
//   chunks (H5Dread_chunk), and HDF5's own filter pipeline (H5Dread) decodes them to the source;
// - reads of random ranges and boxes with 1 and 3 decode threads (chunks decoded straight into the
//   destination, or through the per-thread cache when cut) equal a naive copy of the source;
// - a chunk that does not decode, read on a decode thread, fails with ChunkCorrupt naming the
//   chunk, the dataset, the shard file and the tensor.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <fstream>
#include <random>

#include "formats/store/h5/h5_handles.h"
#include "formats/store/h5/h5_types.h"
#include "formats/store/store_reader.h"
#include "formats/store/store_writer.h"
#include "tests/formats/store/store_test_util.h"

namespace ckpt::store {
namespace {

using testing::DenseTensor;

struct ThreadsCase {
  std::vector<DenseTensor> tensors;
  std::vector<Piece> pieces;
};

// bf16 values of small magnitude (compressible like weights), f32, u8; row pieces.
ThreadsCase threads_case() {
  std::mt19937_64 rng(21);
  ThreadsCase c;
  c.tensors.push_back(testing::random_tensor("w.bf16", DType::kBF16, {96, 130}, rng));
  for (size_t i = 1; i < c.tensors[0].bytes.size(); i += 2) c.tensors[0].bytes[i] = static_cast<uint8_t>(0x3c + rng() % 3);
  c.tensors.push_back(testing::random_tensor("w.f32", DType::kF32, {7, 3, 50}, rng));
  c.tensors.push_back(testing::random_tensor("w.u8", DType::kU8, {5000}, rng));
  c.pieces.push_back({"w.bf16", Region{Box{{0, 0}, {61, 130}}, 0, -1}, DType::kBF16});
  c.pieces.push_back({"w.bf16", Region{Box{{61, 0}, {35, 130}}, 0, -1}, DType::kBF16});
  c.pieces.push_back({"w.f32", Region{Box::whole({7, 3, 50}), 0, -1}, DType::kF32});
  c.pieces.push_back({"w.u8", Region{Box::whole({5000}), 0, -1}, DType::kU8});
  return c;
}

// `chunk_bytes` 2000: many chunks, edge chunks included.
std::string write_threads_store(const ThreadsCase& c, const std::string& dst, int threads, int64_t slab, uint64_t chunk_bytes = 2000,
                                IoMode io = IoMode::kAuto) {
  StoreOptions o;
  o.codec = Codec::kShuffleZstd;
  o.chunk_bytes = chunk_bytes;
  o.io = io;
  o.hash_threads = threads;
  o.fsync = false;
  StoreWriter w(dst, o);
  std::vector<TensorMeta> metas;
  for (const auto& t : c.tensors) metas.push_back(t.meta);
  EXPECT_TRUE(w.begin(metas, c.pieces, nlohmann::json::object()).ok());
  for (size_t k = 0; k < c.pieces.size(); ++k) {
    const DenseTensor* t = nullptr;
    for (const auto& x : c.tensors)
      if (x.meta.name == c.pieces[k].tensor) t = &x;
    const auto bytes = testing::naive_piece(*t, c.pieces[k].region);
    const int64_t n = c.pieces[k].region.numel(), step = slab > 0 ? slab : n;
    const size_t es = dtype_size(t->meta.dtype);
    for (int64_t a = 0; a < n; a += step) EXPECT_TRUE(w.write(k, bytes.data() + a * es, std::min(step, n - a)).ok());
  }
  EXPECT_TRUE(w.commit().ok());
  return dst;
}

// HDF5's own pipeline (default driver, shuffle, zstd filter) decodes every piece to the source.
void expect_hdf5_reads_source(const ThreadsCase& c, const std::string& dst) {
  auto lock = h5_lock();
  H5Id f = h5_file(H5Fopen((dst + "/shards/r00000.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  ASSERT_TRUE(f.valid()) << dst;
  for (size_t k = 0; k < c.pieces.size(); ++k) {
    const DenseTensor* t = nullptr;
    for (const auto& x : c.tensors)
      if (x.meta.name == c.pieces[k].tensor) t = &x;
    char name[32];
    std::snprintf(name, sizeof name, "/p%06zu", k);
    H5Id d = h5_dataset(H5Dopen2(f.get(), name, H5P_DEFAULT));
    const auto want = testing::naive_piece(*t, c.pieces[k].region);
    std::vector<uint8_t> got(want.size());
    ASSERT_GE(H5Dread(d.get(), h5_type_for(t->meta.dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, got.data()), 0);
    EXPECT_EQ(got, want) << name;
  }
}

// Every stored chunk of every dataset of the store's shard, raw.
std::vector<std::string> stored_chunks(const std::string& dst) {
  std::vector<std::string> out;
  auto lock = h5_lock();
  H5Id f = h5_file(H5Fopen((dst + "/shards/r00000.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  for (int i = 0; i < 4; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "/p%06d", i);
    H5Id d = h5_dataset(H5Dopen2(f.get(), name, H5P_DEFAULT));
    H5Id sp = h5_space(H5Dget_space(d.get()));
    hsize_t n = 0;
    EXPECT_GE(H5Dget_num_chunks(d.get(), sp.get(), &n), 0);
    for (hsize_t k = 0; k < n; ++k) {
      hsize_t off[3] = {0, 0, 0}, size = 0;
      unsigned mask = 0;
      haddr_t addr = 0;
      EXPECT_GE(H5Dget_chunk_info(d.get(), sp.get(), k, off, &mask, &addr, &size), 0);
      std::string raw(size, '\0');
      uint32_t fm = 0;
      EXPECT_GE(H5Dread_chunk(d.get(), H5P_DEFAULT, off, &fm, raw.data()), 0);
      out.push_back(std::string(name) + "@" + std::to_string(off[0]) + ":" + raw);
    }
  }
  return out;
}

TEST(ChunkThreads, StoredChunksDoNotDependOnThreadsOrWriteSizes) {
  const ThreadsCase c = threads_case();
  const std::string root = testing::temp_dir("chunk_threads");
  const auto one = stored_chunks(write_threads_store(c, root + "/t1", 1, 0));
  EXPECT_GE(one.size(), 20u);
  for (auto [threads, slab] : {std::pair{3, 0L}, std::pair{3, 37L}, std::pair{2, 4001L}}) {
    const std::string dst = write_threads_store(c, root + "/t" + std::to_string(threads) + "_" + std::to_string(slab), threads, slab);
    EXPECT_EQ(stored_chunks(dst), one) << threads << " threads, slab " << slab;
    expect_hdf5_reads_source(c, dst);
  }
}

// Stored chunks of 64 KiB and more go through ckpt's file driver with --io direct (O_DIRECT for
// their whole blocks, formats/store/direct_vfd.h): the shard file is the same bytes as with
// buffered writes, and HDF5's default driver and filter pipeline read the source from it.
TEST(ChunkThreads, DirectWritesOfStoredChunksGiveTheSameFile) {
  std::mt19937_64 rng(8);
  ThreadsCase c;
  c.tensors.push_back(testing::random_tensor("big.bf16", DType::kBF16, {640, 1000}, rng));
  for (size_t i = 1; i < c.tensors[0].bytes.size(); i += 2) c.tensors[0].bytes[i] = static_cast<uint8_t>(0x3c + rng() % 3);
  c.tensors.push_back(testing::random_tensor("big.u8", DType::kU8, {300001}, rng));  // incompressible: odd stored sizes
  c.pieces.push_back({"big.bf16", Region{Box{{0, 0}, {333, 1000}}, 0, -1}, DType::kBF16});
  c.pieces.push_back({"big.bf16", Region{Box{{333, 0}, {307, 1000}}, 0, -1}, DType::kBF16});
  c.pieces.push_back({"big.u8", Region{Box::whole({300001}), 0, -1}, DType::kU8});
  const std::string root = testing::temp_dir("chunk_threads_direct");
  const std::string buffered = write_threads_store(c, root + "/buffered", 2, 0, 200000, IoMode::kBuffered);
  for (int64_t slab : {0L, 70001L}) {
    const std::string direct = write_threads_store(c, root + "/direct" + std::to_string(slab), 2, slab, 200000, IoMode::kDirect);
    EXPECT_EQ(testing::read_file_bytes(direct + "/shards/r00000.h5"), testing::read_file_bytes(buffered + "/shards/r00000.h5"))
        << "slab " << slab;
    expect_hdf5_reads_source(c, direct);
  }
}

TEST(ChunkThreads, ThreadedReadsOfRandomRangesAndBoxesEqualTheSource) {
  const ThreadsCase c = threads_case();
  const std::string dst = write_threads_store(c, testing::temp_dir("chunk_threads_read") + "/s", 2, 0);
  std::mt19937_64 rng(3);
  for (int threads : {1, 3}) {
    auto r = StoreReader::open(dst);
    ASSERT_TRUE(r.ok());
    (*r)->set_decode_threads(threads);
    for (int trial = 0; trial < 60; ++trial) {
      const size_t k = rng() % c.pieces.size();
      const Piece& p = c.pieces[k];
      const DenseTensor* t = nullptr;
      for (const auto& x : c.tensors)
        if (x.meta.name == p.tensor) t = &x;
      const size_t es = dtype_size(p.dtype);
      const auto whole = testing::naive_piece(*t, p.region);
      const int64_t n = p.region.numel();
      int64_t a = static_cast<int64_t>(rng() % static_cast<uint64_t>(n)), b = static_cast<int64_t>(rng() % static_cast<uint64_t>(n + 1));
      if (trial % 4 == 0) a = 0, b = n;  // whole chunks decoded straight into dst
      if (a > b) std::swap(a, b);
      std::vector<uint8_t> got(static_cast<size_t>(b - a) * es);
      ASSERT_TRUE((*r)->read_storage_range(k, a, b, got.data()).ok());
      EXPECT_TRUE(std::equal(got.begin(), got.end(), whole.begin() + a * static_cast<int64_t>(es))) << p.tensor << " " << a << ".." << b;
      const Box sub = trial % 4 == 1 ? p.region.box : testing::random_sub_box(p.region.box, rng);
      std::vector<uint8_t> box(static_cast<size_t>(sub.numel()) * es);
      ASSERT_TRUE((*r)->read(k, sub, box.data()).ok());
      EXPECT_EQ(box, testing::naive_extract(*t, sub)) << p.tensor << " " << sub.to_string() << " threads " << threads;
    }
  }
}

TEST(ChunkThreads, AChunkThatDoesNotDecodeOnADecodeThreadIsNamed) {
  const ThreadsCase c = threads_case();
  const std::string dst = write_threads_store(c, testing::temp_dir("chunk_threads_bad") + "/s", 2, 0);
  const std::string file = dst + "/shards/r00000.h5";
  haddr_t addr = 0;
  hsize_t size = 0, off[2] = {0, 0};
  {
    auto lock = h5_lock();
    H5Id f = h5_file(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    H5Id d = h5_dataset(H5Dopen2(f.get(), "/p000000", H5P_DEFAULT));
    H5Id sp = h5_space(H5Dget_space(d.get()));
    unsigned mask = 0;
    ASSERT_GE(H5Dget_chunk_info(d.get(), sp.get(), 5, off, &mask, &addr, &size), 0);  // a middle chunk
  }
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(addr + size - 2));  // inside the frame checksum
    const char was = static_cast<char>(f.get());
    f.seekp(static_cast<std::streamoff>(addr + size - 2));
    f.put(static_cast<char>(was ^ 0x10));
  }
  const auto cd = piece_chunk_dims({61, 130}, 2, 2000);
  const std::string chunk = "chunk " + std::to_string(off[0] / cd[0]) + ":";
  for (int threads : {1, 3}) {
    auto r = StoreReader::open(dst);
    ASSERT_TRUE(r.ok());
    (*r)->set_decode_threads(threads);
    const int64_t n = c.pieces[0].region.numel();
    std::vector<uint8_t> buf(static_cast<size_t>(n) * 2);
    for (int how = 0; how < 2; ++how) {
      Status st = how == 0 ? (*r)->read_storage_range(0, 0, n, buf.data()) : (*r)->read(0, c.pieces[0].region.box, buf.data());
      ASSERT_FALSE(st.ok());
      EXPECT_EQ(st.code(), "ChunkCorrupt") << st.to_string();
      EXPECT_NE(st.message().find(chunk), std::string::npos) << st.to_string();
      EXPECT_NE(st.message().find("/p000000"), std::string::npos) << st.to_string();
      EXPECT_EQ(st.file(), file);
      EXPECT_EQ(st.tensor(), "w.bf16");
    }
  }
}

}  // namespace
}  // namespace ckpt::store
