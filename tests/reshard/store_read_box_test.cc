// read_global_box over a native store (the one way to read a box of a tensor across pieces):
// random tensors of several dtypes split into random pieces (boxes and flat ranges), written
// with each codec; random boxes that cross piece boundaries are read in the stored dtype and
// compared with a naive index-by-index extraction (store_test_util.h); F32 tensors are also read
// as F64 and compared with a per-element widening of the same reference.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "formats/store/store_reader.h"
#include "formats/store/store_writer.h"
#include "reshard/executor.h"
#include "tests/formats/store/store_test_util.h"

namespace ckpt {
namespace {

namespace st = store::testing;

std::vector<st::DenseTensor> random_tensors(std::mt19937_64& rng) {
  const DType dts[] = {DType::kF32, DType::kBF16, DType::kI64, DType::kU8, DType::kF64, DType::kF16};
  std::vector<st::DenseTensor> ts;
  const int nt = 2 + static_cast<int>(rng() % 3);
  for (int i = 0; i < nt; ++i) {
    Shape s(1 + rng() % 3);
    for (auto& d : s) d = 1 + static_cast<int64_t>(rng() % 19);
    ts.push_back(st::random_tensor("t" + std::to_string(i), dts[rng() % 6], s, rng));
  }
  ts.push_back(st::random_tensor("f32", DType::kF32, {7, 9}, rng));
  ts.push_back(st::random_tensor("scalar", DType::kF32, {}, rng));
  return ts;
}

void write_store(const std::string& dst, const std::vector<st::DenseTensor>& ts, const std::vector<Piece>& pieces,
                 store::Codec codec) {
  store::StoreOptions opts;
  opts.codec = codec;
  opts.chunk_bytes = 96;  // several chunks per compressed piece
  opts.fsync = false;
  std::vector<TensorMeta> metas;
  for (const auto& t : ts) metas.push_back(t.meta);
  store::StoreWriter w(dst, opts);
  ASSERT_TRUE(w.begin(metas, pieces, nlohmann::json::object()).ok());
  for (size_t i = 0; i < pieces.size(); ++i) {
    const st::DenseTensor* t = nullptr;
    for (const auto& d : ts)
      if (d.meta.name == pieces[i].tensor) t = &d;
    const auto bytes = st::naive_piece(*t, pieces[i].region);
    ASSERT_TRUE(w.write(i, bytes.data(), pieces[i].region.numel()).ok());
  }
  Status c = w.commit();
  ASSERT_TRUE(c.ok()) << c.to_string();
}

class StoreReadBox : public ::testing::TestWithParam<store::Codec> {};

TEST_P(StoreReadBox, RandomBoxesAcrossPieces) {
  const std::string dir = st::temp_dir("readbox");
  for (int seed = 0; seed < 6; ++seed) {
    std::mt19937_64 rng(77 + seed);
    auto ts = random_tensors(rng);
    std::vector<Piece> pieces;
    for (const auto& t : ts) {
      auto ps = st::random_pieces(t.meta, rng);
      pieces.insert(pieces.end(), ps.begin(), ps.end());
    }
    const std::string dst = dir + "/s" + std::to_string(seed);
    write_store(dst, ts, pieces, GetParam());
    auto r = store::StoreReader::open(dst);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    auto idx = SourceIndex::build(**r);
    ASSERT_TRUE(idx.ok()) << idx.status().to_string();
    for (const auto& t : ts) {
      for (int k = 0; k < 5; ++k) {
        const Box box = st::random_sub_box(Box::whole(t.meta.shape), rng);
        const auto want = st::naive_extract(t, box);
        std::vector<uint8_t> got(want.size());
        Status s = read_global_box(**r, *idx, t.meta.name, box, t.meta.dtype, got.data());
        ASSERT_TRUE(s.ok()) << s.to_string();
        ASSERT_EQ(got, want) << t.meta.name << " box " << box.to_string();
        if (t.meta.dtype != DType::kF32) continue;
        std::vector<double> wide(static_cast<size_t>(box.numel()));
        ASSERT_TRUE(read_global_box(**r, *idx, t.meta.name, box, DType::kF64, wide.data()).ok());
        for (size_t e = 0; e < wide.size(); ++e) {
          float f;
          std::memcpy(&f, want.data() + 4 * e, 4);
          if (f == f) {
            ASSERT_EQ(wide[e], static_cast<double>(f)) << t.meta.name << " element " << e;
          } else {
            ASSERT_NE(wide[e], wide[e]);  // NaN stays NaN
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, StoreReadBox,
                         ::testing::Values(store::Codec::kNone, store::Codec::kShuffleZstd, store::Codec::kZstd));

}  // namespace
}  // namespace ckpt
