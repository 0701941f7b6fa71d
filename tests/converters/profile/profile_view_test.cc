// The tracking cast against the compiler's _Float16 (libgcc rounding; under clang 14, which has no
// _Float16 on x86, the CPU's F16C conversion: both independent of formats/), the exactness
// report's merge and JSON, and the profile views against a naive
// element-by-element construction of packed, padded, transposed tensors.
#include "converters/profile/profile_view.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#if defined(__clang__) && __clang_major__ < 15
#include <immintrin.h>
#endif

#include "reshard/executor.h"
#include "reshard/memory_io.h"

namespace ckpt {
namespace {

// float -> IEEE half bits, round to nearest even, and back: the reference conversion.
#if defined(__clang__) && __clang_major__ < 15
__attribute__((target("f16c"))) uint16_t ref_f16_bits(float x) {
  return static_cast<uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) float ref_f16_value(uint16_t h) { return _cvtsh_ss(h); }
#else
uint16_t ref_f16_bits(float x) {
  const _Float16 h = static_cast<_Float16>(x);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
float ref_f16_value(uint16_t b) {
  _Float16 h;
  std::memcpy(&h, &b, 2);
  return static_cast<float>(h);
}
#endif

TEST(TrackedCast, F32ToF16MatchesFloat16Reference) {
  std::mt19937 rng(7);
  std::vector<float> x(20000);
  for (size_t i = 0; i < x.size(); ++i) {
    const float m = std::uniform_real_distribution<float>(-1, 1)(rng);
    x[i] = std::ldexp(m, std::uniform_int_distribution<int>(-30, 17)(rng));  // subnormals to overflow
  }
  x[3] = 7e4f;
  x[4] = -1e30f;
  x[5] = std::numeric_limits<float>::quiet_NaN();
  x[6] = INFINITY;
  x[7] = 0.0f;
  x[8] = 1.5f;  // exact
  uint64_t changed = 0, clamped = 0;
  double max_abs = 0, max_rel = 0;
  std::vector<uint16_t> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    uint16_t h = ref_f16_bits(x[i]);
    if (std::isfinite(x[i]) && std::isinf(ref_f16_value(h))) {
      ++clamped;
      h = ref_f16_bits(x[i] > 0 ? 65504.0f : -65504.0f);
    }
    want[i] = h;
    const double a = x[i], b = ref_f16_value(h);
    if (a == b || std::isnan(a)) continue;
    ++changed;
    max_abs = std::max(max_abs, std::fabs(b - a));
    if (a != 0) max_rel = std::max(max_rel, std::fabs(b - a) / std::fabs(a));
  }
  ASSERT_GE(clamped, 2u);
  std::vector<uint16_t> got(x.size());
  ExactnessEntry e;
  CastOptions sat;
  sat.overflow = OverflowPolicy::kSaturate;
  ASSERT_TRUE(tracked_cast(x.data(), DType::kF32, got.data(), DType::kF16, x.size(), sat, e).ok());
  for (size_t i = 0; i < x.size(); ++i)
    if (!std::isnan(x[i])) {
      ASSERT_EQ(got[i], want[i]) << i << " " << x[i];
    }
  EXPECT_EQ(e.elements, x.size());
  EXPECT_EQ(e.changed, changed);
  EXPECT_EQ(e.clamped, clamped);
  EXPECT_EQ(e.max_abs, max_abs);
  EXPECT_EQ(e.max_rel, max_rel);

  ExactnessEntry e2;
  Status st = tracked_cast(x.data(), DType::kF32, got.data(), DType::kF16, x.size(), CastOptions{}, e2);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), "CastOverflow");
  EXPECT_NE(st.message().find(std::to_string(clamped) + " finite values"), std::string::npos) << st.message();
}

TEST(TrackedCast, WideningAndSameTypeAreNotTracked) {
  std::vector<uint16_t> h = {0x3c00, 0x7bff};
  std::vector<float> f(2);
  ExactnessEntry e;
  ASSERT_TRUE(tracked_cast(h.data(), DType::kF16, f.data(), DType::kF32, 2, {}, e).ok());
  EXPECT_EQ(e.elements, 0u);
  EXPECT_EQ(f[1], 65504.0f);
  EXPECT_TRUE(cast_is_exact(DType::kBF16, DType::kF32));
  EXPECT_FALSE(cast_is_exact(DType::kBF16, DType::kF16));
  EXPECT_FALSE(cast_is_exact(DType::kF16, DType::kBF16));
}

TEST(ExactnessReport, MergesAndRoundTripsJson) {
  ExactnessReport a, b;
  a.add({"w", "W", "cast F32->F16", 10, 3, 1, 0.5, 0.01});
  b.add({"w", "W", "cast F32->F16", 5, 2, 0, 0.7, 0.001});
  b.add({"e", "E", "dropped padding rows", 8, 0, 0, 0, 0});
  a.merge(b);
  auto es = a.entries();
  ASSERT_EQ(es.size(), 2u);
  EXPECT_EQ(es[1].tensor, "w");
  EXPECT_EQ(es[1].elements, 15u);
  EXPECT_EQ(es[1].changed, 5u);
  EXPECT_EQ(es[1].clamped, 1u);
  EXPECT_EQ(es[1].max_abs, 0.7);
  EXPECT_EQ(es[1].max_rel, 0.01);
  EXPECT_FALSE(a.exact());
  auto back = ExactnessReport::from_json(nlohmann::json::parse(a.to_json().dump()), "test");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->to_json(), a.to_json());
  EXPECT_EQ(ExactnessReport::from_json(nlohmann::json{{"steps", {{{"tensor", 1}}}}}, "x").status().code(),
            "BadExactnessReport");
}

// Canonical tensors w [6, 4], k [3, 4], e [5, 4] (f32, value = 1000 * t + 10 * r + c + 0.1234);
// profile: "qk" = transpose([w; k]) f16 [4, 9]; "emb" = [e; 3 zero rows] f32 [8, 4].
struct ViewFixture {
  std::vector<TensorMeta> canon = {{"w", DType::kF32, {6, 4}}, {"k", DType::kF32, {3, 4}}, {"e", DType::kF32, {5, 4}}};
  std::vector<ProfileTensor> pts;
  ViewFixture() {
    ProfileTensor qk{"qk", {4, 9}, DType::kF16, true, TensorClass::kWeight, {}};
    qk.segments = {{"w", Box::whole({6, 4}), 0}, {"k", Box::whole({3, 4}), 0}};
    ProfileTensor emb{"emb", {8, 4}, DType::kF32, false, TensorClass::kEmbedding, {}};
    emb.segments = {{"e", Box::whole({5, 4}), 0}, {"", Box{}, 3}};
    pts = {qk, emb};
  }
  static float value(int t, int64_t r, int64_t c) { return 1000.0f * t + 10.0f * r + c + 0.1234f; }
  // Canonical pieces: w in two row halves, k whole, e as two flat ranges.
  MemoryCheckpoint canonical() const {
    MemoryCheckpoint m;
    m.tensors = canon;
    auto add = [&](int t, Region reg) {
      std::vector<float> v;
      for (const Box& b : reg.boxes())
        for (int64_t r = 0; r < b.extent[0]; ++r)
          for (int64_t c = 0; c < b.extent[1]; ++c) v.push_back(value(t, b.offset[0] + r, b.offset[1] + c));
      m.pieces.push_back({canon[t].name, reg, DType::kF32});
      m.data.emplace_back(reinterpret_cast<uint8_t*>(v.data()), reinterpret_cast<uint8_t*>(v.data() + v.size()));
    };
    add(0, Region{Box{{0, 0}, {3, 4}}});
    add(0, Region{Box{{3, 0}, {3, 4}}});
    add(1, Region{Box::whole({3, 4})});
    add(2, Region{Box::whole({5, 4}), 0, 7});
    add(2, Region{Box::whole({5, 4}), 7, 20});
    return m;
  }
};

// Whole tensors of `src` through the executor, chunked small.
MemoryCheckpoint materialize(TensorSource& src) {
  std::vector<Piece> out;
  for (const TensorMeta& t : src.tensors()) out.push_back({t.name, Region{Box::whole(t.shape)}, t.dtype});
  MemorySink sink;
  ExecOptions eo;
  eo.max_chunk_bytes = 24;
  Status st = execute(src, sink, src.tensors(), out, src.metadata(), eo);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return sink.take();
}

TEST(ProfileViews, PackTransposePadAndBack) {
  ViewFixture f;
  MemorySource canon(f.canonical());
  auto pv = make_profile_view(canon, nullptr, f.pts, {}, {}, 20);
  ASSERT_TRUE(pv.ok()) << pv.status().to_string();
  MemoryCheckpoint b = materialize(**pv);
  ASSERT_EQ(b.data.size(), 2u);
  const auto* qk = reinterpret_cast<const uint16_t*>(b.data[0].data());
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 9; ++j) {
      const float v = j < 6 ? ViewFixture::value(0, j, i) : ViewFixture::value(1, j - 6, i);
      ASSERT_EQ(qk[i * 9 + j], ref_f16_bits(v)) << i << "," << j;
    }
  const auto* emb = reinterpret_cast<const float*>(b.data[1].data());
  for (int64_t r = 0; r < 8; ++r)
    for (int64_t c = 0; c < 4; ++c) ASSERT_EQ(emb[r * 4 + c], r < 5 ? ViewFixture::value(2, r, c) : 0.0f);
  ExactnessReport rep = (*pv)->report();
  auto es = rep.entries();
  ASSERT_EQ(es.size(), 2u);  // k and w, cast F32->F16; e stays f32
  EXPECT_EQ(es[0].tensor, "k");
  EXPECT_EQ(es[0].elements, 12u);
  EXPECT_EQ(es[1].elements, 24u);
  EXPECT_EQ(es[1].stored_as, "qk");

  // Back: the stored profile tensors (split in other pieces) as the canonical view.
  b.pieces[1] = {"emb", Region{Box{{0, 0}, {8, 4}}, 0, 32}, DType::kF32};
  b.data[1][(7 * 4 + 0) * 4 + 3] = 0x40;  // a non-zero padding element (row 7, col 0, top byte)
  MemorySource stored(std::move(b));
  auto cv = make_canonical_view(stored, nullptr, f.canon, f.pts, {}, 10);
  ASSERT_TRUE(cv.ok()) << cv.status().to_string();
  MemoryCheckpoint back = materialize(**cv);
  ASSERT_EQ(back.tensors[0].dtype, DType::kF16);
  const auto* w = reinterpret_cast<const uint16_t*>(back.data[0].data());
  for (int64_t r = 0; r < 6; ++r)
    for (int64_t c = 0; c < 4; ++c) ASSERT_EQ(w[r * 4 + c], qk[c * 9 + r]);
  const auto* e = reinterpret_cast<const float*>(back.data[2].data());
  for (int64_t i = 0; i < 20; ++i) ASSERT_EQ(e[i], ViewFixture::value(2, i / 4, i % 4));
  ExactnessReport pad;
  ASSERT_TRUE((*cv)->check_padding(pad).ok());
  ASSERT_EQ(pad.entries().size(), 1u);
  EXPECT_EQ(pad.entries()[0].tensor, "e");
  EXPECT_EQ(pad.entries()[0].elements, 12u);
  EXPECT_EQ(pad.entries()[0].changed, 1u);
}

TEST(ProfileViews, RefusesTensorsOutsideTheProfile) {
  ViewFixture f;
  MemoryCheckpoint m = f.canonical();
  MemorySource canon(std::move(m));  // canonical names are not the profile's
  auto cv = make_canonical_view(canon, nullptr, f.canon, f.pts, {});
  ASSERT_FALSE(cv.ok());
  EXPECT_EQ(cv.status().code(), "ProfileTensorMismatch");
  EXPECT_NE(cv.status().message().find("'w'"), std::string::npos);
}

}  // namespace
}  // namespace ckpt
