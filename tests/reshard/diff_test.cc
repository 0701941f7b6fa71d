// ckpt diff core (reshard/diff.h) on tiny in-memory sources defined here (independent of
// reshard/memory_io): results are checked against differences computed naively element by
// element; pieces split in different ways on both sides exercise the global view.
#include "reshard/diff.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>

namespace ckpt {
namespace {

// A source holding whole global tensors in memory (f32 or bf16 values) and exposing them as the
// given pieces. read() copies a sub-box element by element.
class TinySource : public TensorSource {
 public:
  void add(const std::string& name, DType dt, Shape shape, std::vector<float> values,
           std::vector<Region> regions = {}) {
    metas_.push_back(TensorMeta{name, dt, shape});
    data_[name] = std::move(values);
    if (regions.empty()) regions.push_back(Region{Box::whole(shape)});
    for (auto& r : regions) pieces_.push_back(Piece{name, r, dt});
  }
  const std::vector<TensorMeta>& tensors() const override { return metas_; }
  const std::vector<Piece>& pieces() const override { return pieces_; }
  Status read(size_t piece, const Box& sub, void* dst) override {
    ++reads;
    max_read_elems = std::max(max_read_elems, sub.numel());
    const Piece& p = pieces_.at(piece);
    bool inside = false;
    for (const Box& b : p.region.boxes()) inside = inside || b.contains(sub);
    if (!inside) return Status::Internal("read outside piece");
    if (fail_tensor == p.tensor) return Status::Io("injected failure");
    const TensorMeta* m = nullptr;
    for (const auto& t : metas_) if (t.name == p.tensor) m = &t;
    const auto& v = data_.at(p.tensor);
    const size_t es = dtype_size(p.dtype);
    auto* out = static_cast<unsigned char*>(dst);
    const int64_t n = sub.numel();
    Shape idx(sub.ndim());
    for (int64_t e = 0; e < n; ++e) {
      int64_t rem = e, lin = 0, stride = 1;
      for (size_t d = sub.ndim(); d-- > 0;) { idx[d] = sub.offset[d] + rem % sub.extent[d]; rem /= sub.extent[d]; }
      for (size_t d = sub.ndim(); d-- > 0;) { lin += idx[d] * stride; stride *= m->shape[d]; }
      const float x = v[lin];
      if (p.dtype == DType::kF32) std::memcpy(out + e * es, &x, 4);
      else { uint16_t h = f32_to_bf16(x); std::memcpy(out + e * es, &h, 2); }
    }
    return Status::Ok();
  }
  const nlohmann::json& metadata() const override { return meta_; }
  std::string describe() const override { return "tiny"; }

  int64_t reads = 0, max_read_elems = 0;
  std::string fail_tensor;

 private:
  std::vector<TensorMeta> metas_;
  std::vector<Piece> pieces_;
  std::map<std::string, std::vector<float>> data_;
  nlohmann::json meta_ = nlohmann::json::object();
};

std::vector<float> randn(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Rows [a, b) of a [R, C] tensor as a box region.
Region rows(int64_t a, int64_t b, int64_t C) { return Region{Box{{a, 0}, {b - a, C}}}; }

const TensorDiff& find(const DiffReport& r, const std::string& n) {
  for (const auto& t : r.tensors) if (t.name == n) return t;
  static TensorDiff none;
  ADD_FAILURE() << "no tensor " << n;
  return none;
}

TEST(Diff, IdenticalAcrossDifferentPieceSplits) {
  auto w = randn(7 * 5, 1), b = randn(3, 2);
  TinySource a, c;
  a.add("w", DType::kF32, {7, 5}, w);
  a.add("b", DType::kF32, {3}, b);
  a.add("s", DType::kF32, {}, {2.5f});
  // B: w as two row blocks and a flat ZeRO-style piece for the last rows; b as two flat pieces.
  c.add("w", DType::kF32, {7, 5}, w, {rows(0, 3, 5), Region{Box{{3, 0}, {4, 5}}, 0, 7}, Region{Box{{3, 0}, {4, 5}}, 7, 20}});
  c.add("b", DType::kF32, {3}, b, {Region{Box{{0}, {3}}, 0, 1}, Region{Box{{0}, {3}}, 1, 3}});
  c.add("s", DType::kF32, {}, {2.5f});
  auto r = diff_sources(a, c, DiffOptions{});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r->equal());
  ASSERT_EQ(r->tensors.size(), 3u);
  for (const auto& t : r->tensors) {
    EXPECT_EQ(t.kind, TensorDiffKind::kIdentical) << t.name;
    EXPECT_EQ(t.bitwise_differ, 0);
  }
  EXPECT_EQ(find(*r, "w").numel, 35);
  EXPECT_EQ(find(*r, "s").numel, 1);
}

TEST(Diff, DifferencesMatchNaiveComputation) {
  const int64_t R = 40, C = 13;
  auto x = randn(R * C, 2), y = x;
  std::mt19937_64 rng(3);
  for (int k = 0; k < 25; ++k) y[rng() % y.size()] += 1e-3f * static_cast<float>(rng() % 100);
  y[17] = 0.f;  // relative difference against zero is skipped
  x[17] = 0.5f;
  for (double atol : {0.0, 1e-2, 0.05}) {
    for (double rtol : {0.0, 1e-3}) {
      for (int64_t mem : {int64_t{1024}, int64_t{1} << 20}) {
        TinySource a, b;
        a.add("w", DType::kF32, {R, C}, x);
        b.add("w", DType::kF32, {R, C}, y, {rows(0, 11, C), rows(11, 40, C)});
        DiffOptions o;
        o.atol = atol;
        o.rtol = rtol;
        o.max_memory = mem;
        auto r = diff_sources(a, b, o);
        ASSERT_TRUE(r.ok()) << r.status().to_string();
        // Naive reference in double.
        double max_abs = 0, max_rel = 0;
        int64_t not_close = 0, differ = 0, arg = -1;
        for (size_t i = 0; i < x.size(); ++i) {
          double d = std::fabs(double(x[i]) - double(y[i]));
          if (x[i] != y[i]) ++differ;
          if (d > max_abs) { max_abs = d; arg = static_cast<int64_t>(i); }
          if (y[i] != 0) max_rel = std::max(max_rel, d / std::fabs(double(y[i])));
          if (!(d <= atol + rtol * std::fabs(double(y[i])))) ++not_close;
        }
        const auto& t = find(*r, "w");
        EXPECT_EQ(t.bitwise_differ, differ);
        EXPECT_EQ(t.not_close, not_close) << atol << " " << rtol;
        EXPECT_EQ(t.max_abs, max_abs);
        EXPECT_EQ(t.max_rel, max_rel);
        EXPECT_EQ(t.max_abs_index, arg);
        EXPECT_EQ(t.kind, not_close ? TensorDiffKind::kDifferent : TensorDiffKind::kClose);
        EXPECT_EQ(r->equal(), not_close == 0);
        if (mem == 1024) {  // 1 KiB budget: 8 bytes per element pair -> at most 128 elements per read
          EXPECT_LE(a.max_read_elems, 128);
          EXPECT_LE(b.max_read_elems, 128);
        }
      }
    }
  }
}

TEST(Diff, MissingExtraShapeAndDtype) {
  auto v = randn(6, 4);
  TinySource a, b;
  a.add("only_a", DType::kF32, {6}, v);
  b.add("only_b", DType::kF32, {2, 3}, v);
  a.add("shape", DType::kF32, {6}, v);
  b.add("shape", DType::kF32, {2, 3}, v);
  std::vector<float> vb(v.size());
  for (size_t i = 0; i < v.size(); ++i) vb[i] = bf16_to_f32(f32_to_bf16(v[i]));
  a.add("dt", DType::kBF16, {6}, vb);
  b.add("dt", DType::kF32, {6}, vb);
  auto r = diff_sources(a, b, DiffOptions{});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_FALSE(r->equal());
  EXPECT_EQ(find(*r, "only_a").kind, TensorDiffKind::kOnlyInA);
  EXPECT_EQ(find(*r, "only_b").kind, TensorDiffKind::kOnlyInB);
  EXPECT_EQ(find(*r, "shape").kind, TensorDiffKind::kShapeMismatch);
  EXPECT_EQ(find(*r, "dt").kind, TensorDiffKind::kDtypeMismatch);
  EXPECT_EQ(find(*r, "dt").max_abs, 0.0);  // same values in both dtypes
  auto j = r->to_json();
  EXPECT_EQ(j["equal"], false);
  EXPECT_EQ(j["counts"]["only_in_a"], 1);
  EXPECT_EQ(j["counts"]["shape_mismatch"], 1);
  std::string text = r->to_text();
  EXPECT_NE(text.find("shape A [6] vs B [2, 3]"), std::string::npos) << text;
  EXPECT_NE(text.find("dtype A BF16 vs B F32"), std::string::npos) << text;
  // ignore_dtype: equal values in different dtypes are "close".
  TinySource a2, b2;
  a2.add("dt", DType::kBF16, {6}, vb);
  b2.add("dt", DType::kF32, {6}, vb);
  DiffOptions o;
  o.ignore_dtype = true;
  auto r2 = diff_sources(a2, b2, o);
  ASSERT_TRUE(r2.ok());
  EXPECT_TRUE(r2->equal());
  EXPECT_EQ(find(*r2, "dt").kind, TensorDiffKind::kClose);
}

TEST(Diff, NonFinite) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  TinySource a, b;
  a.add("w", DType::kF32, {6}, {nan, inf, -inf, 1.f, nan, 0.f});
  b.add("w", DType::kF32, {6}, {nan, inf, inf, 1.f, 2.f, -0.f});
  auto r = diff_sources(a, b, DiffOptions{});
  ASSERT_TRUE(r.ok());
  const auto& t = find(*r, "w");
  EXPECT_EQ(t.kind, TensorDiffKind::kDifferent);
  EXPECT_EQ(t.nonfinite_differ, 2);  // -inf vs inf, nan vs 2
  EXPECT_EQ(t.not_close, 2);
  EXPECT_EQ(t.bitwise_differ, 3);    // + (0 vs -0)
  EXPECT_EQ(t.max_abs, 0.0);
}

TEST(Diff, ReadErrorNamesTensor) {
  TinySource a, b;
  a.add("good", DType::kF32, {2}, {1, 2});
  a.add("bad", DType::kF32, {2}, {1, 2});
  b.add("good", DType::kF32, {2}, {1, 2});
  b.add("bad", DType::kF32, {2}, {1, 2});
  b.fail_tensor = "bad";
  auto r = diff_sources(a, b, DiffOptions{});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().tensor(), "bad");
  EXPECT_EQ(r.status().kind(), ErrorKind::kIo);
}

TEST(Diff, UncoveredTensorIsAnError) {
  TinySource a, b;
  a.add("w", DType::kF32, {4, 2}, randn(8, 5));
  b.add("w", DType::kF32, {4, 2}, randn(8, 5), {rows(0, 2, 2)});  // rows 2..4 missing
  auto r = diff_sources(a, b, DiffOptions{});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().tensor(), "w");
}


TEST(Diff, RejectsBadOptions) {
  TinySource a, b;
  DiffOptions o;
  o.atol = -1;
  EXPECT_EQ(diff_sources(a, b, o).status().kind(), ErrorKind::kInvalidArgument);
  o.atol = std::nan("");
  EXPECT_EQ(diff_sources(a, b, o).status().kind(), ErrorKind::kInvalidArgument);
}

}  // namespace
}  // namespace ckpt
