// Seeded round-trips through every read path of the store: random tensors (several dtypes),
// random piece splits (boxes and flat ranges), writes in random slab sizes with pieces
// interleaved, compressed and not; read() of random sub-boxes, read_storage_range(), verify();
// single-process and multi-rank (open_rank + finalize). Boxes across pieces are read by the
// engine's read_global_box: tests/reshard/store_read_box_test.cc.
// References are naive index loops over the in-memory source (store_test_util.h).
#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "formats/base/file_io.h"
#include "formats/base/fs_util.h"
#include "formats/store/run_dir.h"
#include "formats/store/store_reader.h"
#include "formats/store/store_writer.h"
#include "tests/formats/store/store_test_util.h"

namespace ckpt::store {
namespace {

using testing::DenseTensor;

struct Case {
  std::vector<DenseTensor> tensors;
  std::vector<Piece> pieces;
  std::vector<TensorMeta> metas() const {
    std::vector<TensorMeta> m;
    for (const auto& t : tensors) m.push_back(t.meta);
    return m;
  }
  const DenseTensor& tensor(const std::string& name) const {
    for (const auto& t : tensors)
      if (t.meta.name == name) return t;
    std::abort();
  }
};

Case random_case(std::mt19937_64& rng) {
  Case c;
  const DType dts[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kI64, DType::kU8, DType::kF64, DType::kI32, DType::kF8E4M3};
  int nt = 2 + static_cast<int>(rng() % 4);
  for (int i = 0; i < nt; ++i) {
    size_t nd = 1 + rng() % 3;
    Shape s(nd);
    for (auto& d : s) d = 1 + static_cast<int64_t>(rng() % 23);
    c.tensors.push_back(testing::random_tensor("t" + std::to_string(i) + ".weight", dts[rng() % 8], s, rng));
  }
  c.tensors.push_back(testing::random_tensor("scalar", DType::kF32, {}, rng));
  c.tensors.push_back(testing::random_tensor("empty", DType::kF32, {0, 5}, rng));
  for (const auto& t : c.tensors) {
    auto ps = testing::random_pieces(t.meta, rng);
    c.pieces.insert(c.pieces.end(), ps.begin(), ps.end());
  }
  std::shuffle(c.pieces.begin(), c.pieces.end(), rng);
  return c;
}

// Feeds every piece's storage-order bytes to `write` in random slabs, pieces interleaved.
template <typename WriteFn>
void feed(const Case& c, const std::vector<size_t>& which, std::mt19937_64& rng, WriteFn write) {
  std::vector<std::vector<uint8_t>> data;
  std::vector<int64_t> pos(which.size(), 0);
  for (size_t k = 0; k < which.size(); ++k) data.push_back(testing::naive_piece(c.tensor(c.pieces[which[k]].tensor), c.pieces[which[k]].region));
  std::vector<size_t> open;
  for (size_t k = 0; k < which.size(); ++k) open.push_back(k);
  while (!open.empty()) {
    size_t oi = rng() % open.size();
    size_t k = open[oi];
    const auto& p = c.pieces[which[k]];
    const int64_t n = p.region.numel();
    const size_t es = dtype_size(p.dtype);
    int64_t cnt = std::min<int64_t>(n - pos[k], 1 + static_cast<int64_t>(rng() % 40));
    if (n > 0) {
      ASSERT_TRUE(write(k, data[k].data() + pos[k] * es, cnt).ok());
    }
    pos[k] += cnt;
    if (pos[k] >= n) open.erase(open.begin() + static_cast<long>(oi));
  }
}

void check_reads(const Case& c, StoreReader& r, std::mt19937_64& rng) {
  ASSERT_EQ(r.tensors().size(), c.tensors.size());
  ASSERT_EQ(r.pieces().size(), c.pieces.size());
  for (size_t i = 0; i < r.pieces().size(); ++i) {
    const Piece& p = r.pieces()[i];
    const auto& t = c.tensor(p.tensor);
    const size_t es = dtype_size(p.dtype);
    // Whole piece in storage order.
    auto want = testing::naive_piece(t, p.region);
    std::vector<uint8_t> got(want.size());
    ASSERT_TRUE(r.read_storage_range(i, 0, p.region.numel(), got.data()).ok());
    ASSERT_EQ(got, want) << p.tensor << " " << p.region.to_string();
    // Random sub-boxes of each of its boxes.
    for (const Box& b : p.region.boxes()) {
      for (int k = 0; k < 4; ++k) {
        Box sub = testing::random_sub_box(b, rng);
        auto w = testing::naive_extract(t, sub);
        std::vector<uint8_t> g(w.size() + 1, 0xEE);
        Status st = r.read(i, sub, g.data());
        ASSERT_TRUE(st.ok()) << st.to_string() << " piece " << p.region.to_string() << " sub " << sub.to_string();
        EXPECT_EQ(g.back(), 0xEE);
        g.pop_back();
        ASSERT_EQ(g, w) << p.tensor << " piece " << p.region.to_string() << " sub " << sub.to_string();
        // A file extent, when offered, holds exactly these bytes (read with plain pread).
        for (const Box& q : {sub, b}) {
          auto ext = r.file_extent(i, q);
          const auto wq = testing::naive_extract(t, q);
          const bool whole_plain = q == b && !p.region.is_flat() && q.numel() > 0 && r.manifest().pieces[i].codec == Codec::kNone;
          if (whole_plain) {
            EXPECT_TRUE(ext.has_value()) << "uncompressed whole piece " << p.region.to_string();
          }
          if (r.manifest().pieces[i].codec != Codec::kNone || p.region.is_flat()) {
            EXPECT_FALSE(ext.has_value());
          }
          if (!ext) continue;
          ASSERT_EQ(ext->bytes, wq.size());
          std::vector<uint8_t> raw(wq.size());
          ASSERT_EQ(::pread(ext->fd, raw.data(), raw.size(), static_cast<off_t>(ext->offset)), static_cast<ssize_t>(raw.size()));
          ASSERT_EQ(raw, wq) << "extent of " << q.to_string() << " in piece " << p.region.to_string();
        }
      }
    }
    (void)es;
  }
  auto rep = r.verify();
  EXPECT_TRUE(rep.ok()) << (rep.failures.empty() ? "" : rep.failures[0].status.to_string());
  EXPECT_EQ(rep.pieces, c.pieces.size());
}

class RoundTrip : public ::testing::TestWithParam<Codec> {};

TEST_P(RoundTrip, SingleProcessRandomSplits) {
  const std::string dir = testing::temp_dir("rt");
  for (int seed = 0; seed < 12; ++seed) {
    std::mt19937_64 rng(1000 + seed);
    Case c = random_case(rng);
    StoreOptions opts;
    opts.codec = GetParam();
    opts.chunk_bytes = 64 + rng() % 512;  // tiny chunks: many per piece, partial edges
    opts.fsync = false;
    const std::string dst = dir + "/" + step_dir_name(seed);
    StoreWriter w(dst, opts);
    nlohmann::json md = {{"layout", {{"tp", 2}, {"pp", 1}}}, {"profile", "reference"}, {"trainer", {{"step", seed}}}};
    ASSERT_TRUE(w.begin(c.metas(), c.pieces, md).ok());
    std::vector<size_t> all(c.pieces.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    feed(c, all, rng, [&](size_t k, const void* d, int64_t n) { return w.write(k, d, n); });
    Status st = w.commit();
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_FALSE(path_exists(dst + ".partial"));
    auto r = StoreReader::open(dst);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ((*r)->metadata()["layout"]["tp"], 2);
    EXPECT_EQ((*r)->metadata()["trainer"]["step"], seed);
    for (const auto& rec : (*r)->manifest().pieces)
      if (rec.bytes > 0) {
        EXPECT_EQ(rec.codec, GetParam());
      }
    check_reads(c, **r, rng);
  }
  std::filesystem::remove_all(dir);
}

TEST_P(RoundTrip, MultiRankOpenRankFinalize) {
  const std::string dir = testing::temp_dir("mr");
  std::mt19937_64 rng(77);
  Case c = random_case(rng);
  StoreOptions opts;
  opts.codec = GetParam();
  opts.fsync = false;
  const std::string dst = dir + "/ckpt";
  ASSERT_TRUE(StoreWriter::prepare_partial(dst).ok());
  const int ranks = 3;
  std::vector<nlohmann::json> gathered;  // as an MPI gather would carry them: JSON
  for (int rank = 0; rank < ranks; ++rank) {
    std::vector<size_t> mine;
    for (size_t i = 0; i < c.pieces.size(); ++i)
      if (static_cast<int>(i % ranks) == rank) mine.push_back(i);
    std::vector<Piece> mp;
    for (size_t i : mine) mp.push_back(c.pieces[i]);
    auto sw = StoreWriter::open_rank(StoreWriter::partial_dir(dst), rank, c.metas(), mp, opts);
    ASSERT_TRUE(sw.ok()) << sw.status().to_string();
    feed(c, mine, rng, [&](size_t k, const void* d, int64_t n) { return (*sw)->write(k, d, n); });
    auto recs = (*sw)->close();
    ASSERT_TRUE(recs.ok()) << recs.status().to_string();
    for (const auto& rec : *recs) gathered.push_back(piece_record_to_json(rec));
  }
  std::vector<PieceRecord> all;
  for (const auto& j : gathered) {
    auto rec = piece_record_from_json(j);
    ASSERT_TRUE(rec.ok());
    all.push_back(*rec);
  }
  // A missing rank's records make finalize fail (gap), leaving no checkpoint.
  std::vector<PieceRecord> partial(all.begin(), all.begin() + static_cast<long>(all.size() / 2));
  Status bad = StoreWriter::finalize(dst, c.metas(), partial, {{"profile", "x"}}, opts);
  EXPECT_FALSE(bad.ok());
  EXPECT_FALSE(path_exists(dst));
  ASSERT_TRUE(StoreWriter::finalize(dst, c.metas(), all, {{"profile", "x"}}, opts).ok());
  auto r = StoreReader::open(dst);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::set<std::string> files;
  for (const auto& rec : (*r)->manifest().pieces) files.insert(rec.file);
  EXPECT_EQ(files.size(), 3u);
  check_reads(c, **r, rng);
  std::filesystem::remove_all(dir);
}

// Uncompressed pieces taken partly as buffers, partly as file extents (copied file to file and
// hashed on the writer's threads, in order per piece), from odd source offsets, pieces
// interleaved; then every read path and verify() as above.
TEST(StoreWriterExtents, MixedBufferAndFileExtentWrites) {
  const std::string dir = testing::temp_dir("ext");
  const std::string src_path = dir + "/source.bin";
  for (int seed = 0; seed < 10; ++seed) {
    std::mt19937_64 rng(3000 + seed);
    Case c = random_case(rng);
    int sfd = ::open(src_path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ASSERT_GE(sfd, 0);
    std::vector<std::vector<uint8_t>> data;
    std::vector<uint64_t> at;  // offset of each piece's bytes in the source file
    uint64_t off = rng() % 5000;
    for (const auto& p : c.pieces) {
      data.push_back(testing::naive_piece(c.tensor(p.tensor), p.region));
      at.push_back(off);
      ASSERT_TRUE(pwrite_full(sfd, data.back().data(), data.back().size(), off, src_path).ok());
      off += data.back().size() + rng() % 3000;
    }
    StoreOptions opts;
    opts.fsync = false;
    opts.hash_threads = 1 + seed % 3;
    const std::string dst = dir + "/" + step_dir_name(seed);
    StoreWriter w(dst, opts);
    ASSERT_TRUE(w.accepts_file_extents());
    ASSERT_TRUE(w.begin(c.metas(), c.pieces, {{"profile", "reference"}}).ok());
    std::vector<int64_t> pos(c.pieces.size(), 0);
    std::vector<size_t> open;
    for (size_t k = 0; k < c.pieces.size(); ++k)
      if (c.pieces[k].region.numel() > 0) open.push_back(k);
    int extents = 0;
    while (!open.empty()) {
      const size_t oi = rng() % open.size(), k = open[oi];
      const int64_t n = c.pieces[k].region.numel();
      const uint64_t es = dtype_size(c.pieces[k].dtype);
      const int64_t cnt = std::min<int64_t>(n - pos[k], 1 + static_cast<int64_t>(rng() % 40));
      Status st;
      if (rng() % 3 == 0) {
        st = w.write(k, data[k].data() + static_cast<uint64_t>(pos[k]) * es, cnt);
      } else {
        ++extents;
        st = w.write_from_file(k, FileExtent{sfd, at[k] + static_cast<uint64_t>(pos[k]) * es, static_cast<uint64_t>(cnt) * es}, cnt);
      }
      ASSERT_TRUE(st.ok()) << st.to_string();
      pos[k] += cnt;
      if (pos[k] >= n) open.erase(open.begin() + static_cast<long>(oi));
    }
    EXPECT_GT(extents, 0);
    Status st = w.commit();
    ::close(sfd);
    ASSERT_TRUE(st.ok()) << st.to_string();
    auto r = StoreReader::open(dst);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    check_reads(c, **r, rng);
  }
  std::filesystem::remove_all(dir);
}

// A file extent whose source is too short fails at the copy (on a hash thread): the error names
// the tensor, commit() reports it, and nothing is left at the destination.
TEST(StoreWriterExtents, ShortSourceFailsTheCommitAndLeavesNothing) {
  const std::string dir = testing::temp_dir("extbad");
  const std::string src_path = dir + "/short.bin";
  int sfd = ::open(src_path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ASSERT_GE(sfd, 0);
  std::vector<uint8_t> bytes(1000, 7);
  ASSERT_TRUE(pwrite_full(sfd, bytes.data(), bytes.size(), 0, src_path).ok());
  StoreOptions opts;
  opts.fsync = false;
  const std::string dst = dir + "/out";
  StoreWriter w(dst, opts);
  std::vector<TensorMeta> t = {{"w", DType::kF32, {100, 10}}};
  std::vector<Piece> p = {{"w", Region{Box::whole({100, 10})}, DType::kF32}};
  ASSERT_TRUE(w.begin(t, p, {}).ok());
  Status st = w.write_from_file(0, FileExtent{sfd, 0, 4000}, 1000);  // only 1000 bytes there
  if (st.ok()) st = w.commit();
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.code(), "ShortSource") << st.to_string();
  EXPECT_EQ(st.tensor(), "w");
  w.abort();
  EXPECT_FALSE(path_exists(dst));
  EXPECT_FALSE(path_exists(dst + ".partial"));
  ::close(sfd);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Codecs, RoundTrip, ::testing::Values(Codec::kNone, Codec::kShuffleZstd, Codec::kZstd),
                         [](const auto& info) {
                           return std::string(info.param == Codec::kNone ? "plain" : info.param == Codec::kZstd ? "zstd" : "shuffle_zstd");
                         });

TEST(StoreWriter, BeginRejectsBadPiecesBeforeTouchingDisk) {
  const std::string dir = testing::temp_dir("bad");
  std::vector<TensorMeta> ts = {{"w", DType::kF32, {4, 4}}};
  std::vector<Piece> overlap = {{"w", Region{Box{{0, 0}, {4, 3}}, 0, -1}, DType::kF32}, {"w", Region{Box{{0, 2}, {4, 2}}, 0, -1}, DType::kF32}};
  StoreWriter w(dir + "/c", {});
  Status st = w.begin(ts, overlap, {});
  EXPECT_EQ(st.kind(), ErrorKind::kInvalidArgument);
  EXPECT_NE(st.message().find("PieceOverlap"), std::string::npos) << st.to_string();
  EXPECT_FALSE(path_exists(dir + "/c.partial"));
  std::vector<Piece> gap = {{"w", Region{Box{{0, 0}, {4, 3}}, 0, -1}, DType::kF32}};
  StoreWriter w2(dir + "/c", {});
  EXPECT_NE(w2.begin(ts, gap, {}).message().find("PieceGap"), std::string::npos);
  StoreWriter w3(dir + "/c", {});
  EXPECT_FALSE(w3.begin(ts, {{"w", Region{Box::whole({4, 4}), 0, -1}, DType::kF32}}, {{"pieces", 1}}).ok());
  std::filesystem::remove_all(dir);
}

TEST(StoreWriter, AbortAndIncompleteLeaveNothing) {
  const std::string dir = testing::temp_dir("abort");
  std::vector<TensorMeta> ts = {{"w", DType::kF32, {4, 4}}};
  std::vector<Piece> ps = {{"w", Region{Box::whole({4, 4}), 0, -1}, DType::kF32}};
  std::vector<float> v(16, 1.0f);
  {
    StoreWriter w(dir + "/c", {});
    ASSERT_TRUE(w.begin(ts, ps, {}).ok());
    ASSERT_TRUE(w.write(0, v.data(), 8).ok());
    EXPECT_FALSE(w.write(0, v.data(), 9).ok());  // more than the piece holds
    Status st = w.commit();                      // incomplete piece
    EXPECT_FALSE(st.ok());
  }
  EXPECT_FALSE(path_exists(dir + "/c"));
  EXPECT_FALSE(path_exists(dir + "/c.partial"));
  {
    StoreWriter w(dir + "/c", {});
    ASSERT_TRUE(w.begin(ts, ps, {}).ok());
    EXPECT_TRUE(path_exists(dir + "/c.partial"));
  }  // destroyed without commit -> aborted
  EXPECT_FALSE(path_exists(dir + "/c.partial"));
  std::filesystem::remove_all(dir);
}

TEST(RunDir, LatestAndPartial) {
  const std::string dir = testing::temp_dir("run");
  EXPECT_EQ(step_dir_name(100), "step-00000100");
  std::vector<TensorMeta> ts = {{"w", DType::kF32, {2}}};
  std::vector<Piece> ps = {{"w", Region{Box::whole({2}), 0, -1}, DType::kF32}};
  float v[2] = {1, 2};
  for (int step : {100, 200}) {
    StoreWriter w(dir + "/" + step_dir_name(step), {});
    ASSERT_TRUE(w.begin(ts, ps, {}).ok());
    ASSERT_TRUE(w.write(0, v, 2).ok());
    ASSERT_TRUE(w.commit().ok());
    ASSERT_TRUE(write_latest(dir, step_dir_name(step)).ok());
  }
  auto r = resolve_checkpoint(dir);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, dir + "/step-00000200");
  // An unfinished checkpoint is never taken for one.
  StoreWriter w(dir + "/" + step_dir_name(300), {});
  ASSERT_TRUE(w.begin(ts, ps, {}).ok());
  EXPECT_EQ(resolve_checkpoint(dir + "/step-00000300.partial").status().code(), "NotCheckpoint");
  EXPECT_FALSE(write_latest(dir, "step-00000300.partial").ok());
  EXPECT_FALSE(write_latest(dir, "step-00000300").ok());
  EXPECT_EQ(*resolve_checkpoint(dir), dir + "/step-00000200");
  ASSERT_TRUE(write_file_atomic(dir + "/latest", "../etc\n").ok());
  EXPECT_EQ(resolve_checkpoint(dir).status().code(), "BadLatest");
  EXPECT_EQ(resolve_checkpoint(dir + "/nope").status().kind(), ErrorKind::kNotFound);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ckpt::store
