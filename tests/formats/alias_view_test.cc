// AliasView (formats/tensor/alias_view.h): one test per rule, and reads through the view checked
// element by element against the value each element must have, computed naively from its
// position in the source tensor (a source defined here, whose element (i, j, k) of tensor T is
// alias_value(T, flat row-major index)).
#include "formats/tensor/alias_view.h"

#include <gtest/gtest.h>

#include <map>

namespace ckpt {
namespace {

float alias_value(const std::string& tensor, int64_t flat) { return static_cast<float>(tensor.size() * 1000 + flat); }

int64_t alias_flat_of(const Shape& shape, const Shape& idx) {
  int64_t f = 0;
  for (size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + idx[d];
  return f;
}

// Calls fn(index) for every index of `box`, row-major.
template <class Fn>
void alias_each_index(const Box& box, Fn fn) {
  if (box.numel() == 0) return;
  Shape idx = box.offset;
  for (;;) {
    fn(idx);
    size_t d = box.ndim();
    while (d > 0) {
      --d;
      if (++idx[d] < box.offset[d] + box.extent[d]) break;
      idx[d] = box.offset[d];
      if (d == 0) return;
    }
    if (box.ndim() == 0) return;
  }
}

class AliasValueSource : public TensorSource {
 public:
  void add(const std::string& name, Shape shape, std::vector<Region> regions = {}, DType dt = DType::kF32) {
    metas_.push_back(TensorMeta{name, dt, shape});
    if (regions.empty()) regions.push_back(Region{Box::whole(shape)});
    for (auto& r : regions) pieces_.push_back(Piece{name, r, dt});
  }
  const std::vector<TensorMeta>& tensors() const override { return metas_; }
  const std::vector<Piece>& pieces() const override { return pieces_; }
  Status read(size_t piece, const Box& sub, void* dst) override {
    const Piece& p = pieces_.at(piece);
    if (!p.region.box.contains(sub)) return Status::Internal("read outside the piece: " + sub.to_string());
    const Shape* shape = nullptr;
    for (const auto& t : metas_)
      if (t.name == p.tensor) shape = &t.shape;
    float* out = static_cast<float*>(dst);
    alias_each_index(sub, [&](const Shape& idx) { *out++ = alias_value(p.tensor, alias_flat_of(*shape, idx)); });
    return Status::Ok();
  }
  const nlohmann::json& metadata() const override { return md_; }
  std::string describe() const override { return "values"; }

 private:
  std::vector<TensorMeta> metas_;
  std::vector<Piece> pieces_;
  nlohmann::json md_ = nlohmann::json::object();
};

Box abox(Shape offset, Shape extent) { return Box{std::move(offset), std::move(extent)}; }

std::string alias_code_of(const Result<std::unique_ptr<TensorSource>>& r) { return r.ok() ? "ok" : r.status().code(); }

// Every element of every view piece equals the source element the aliases name (expected(view
// tensor, view index) -> source value), read as whole pieces and as single rows.
template <class Expect>
void check_reads(TensorSource& view, Expect expected) {
  for (size_t i = 0; i < view.pieces().size(); ++i) {
    const Piece& p = view.pieces()[i];
    std::vector<float> got(static_cast<size_t>(p.region.box.numel()));
    ASSERT_TRUE(view.read(i, p.region.box, got.data()).ok()) << p.tensor;
    size_t k = 0;
    alias_each_index(p.region.box, [&](const Shape& idx) { EXPECT_EQ(got[k++], expected(p.tensor, idx)) << p.tensor; });
  }
}

TEST(AliasView, PerExpertTensorsOfAStackedTensorSplitAcrossPieces) {
  AliasValueSource src;  // [E=3, F=4, D=5] held as two TP pieces along F
  src.add("w", {3, 4, 5}, {Region{abox({0, 0, 0}, {3, 2, 5})}, Region{abox({0, 2, 0}, {3, 2, 5})}});
  std::vector<TensorMeta> ts;
  std::vector<TensorAlias> as;
  for (int64_t e = 0; e < 3; ++e) {
    const std::string n = "e" + std::to_string(e);
    ts.push_back(TensorMeta{n, DType::kF32, {4, 5}});
    as.push_back(TensorAlias{n, Box::whole({4, 5}), "w", abox({e, 0, 0}, {1, 4, 5})});
  }
  auto view = make_alias_view(src, ts, as);
  ASSERT_TRUE(view.ok()) << view.status().to_string();
  EXPECT_EQ((*view)->pieces().size(), 6u);  // each expert: two pieces, one per source piece
  check_reads(**view, [](const std::string& t, const Shape& idx) {
    const int64_t e = t[1] - '0';
    return alias_value("w", alias_flat_of({3, 4, 5}, {e, idx[0], idx[1]}));
  });
}

TEST(AliasView, StackedTensorFromPerExpertTensorsAndGateUpHalves) {
  AliasValueSource src;
  src.add("x0", {4, 5});
  src.add("x1", {4, 5});
  src.add("gate_up", {2, 8, 5});
  std::vector<TensorMeta> ts = {{"stacked", DType::kF32, {2, 4, 5}}, {"up", DType::kF32, {2, 4, 5}}};
  std::vector<TensorAlias> as = {{"stacked", abox({0, 0, 0}, {1, 4, 5}), "x0", Box::whole({4, 5})},
                                 {"stacked", abox({1, 0, 0}, {1, 4, 5}), "x1", Box::whole({4, 5})},
                                 {"up", Box::whole({2, 4, 5}), "gate_up", abox({0, 4, 0}, {2, 4, 5})}};
  auto view = make_alias_view(src, ts, as);
  ASSERT_TRUE(view.ok()) << view.status().to_string();
  check_reads(**view, [](const std::string& t, const Shape& idx) {
    if (t == "up") return alias_value("gate_up", alias_flat_of({2, 8, 5}, {idx[0], idx[1] + 4, idx[2]}));
    return alias_value(idx[0] == 0 ? "x0" : "x1", alias_flat_of({4, 5}, {idx[1], idx[2]}));
  });
  // A sub-box of a view piece reads the matching sub-box of the source.
  std::vector<float> row(5);
  ASSERT_TRUE((*view)->read(1, abox({1, 2, 0}, {1, 1, 5}), row.data()).ok());
  for (int64_t k = 0; k < 5; ++k) EXPECT_EQ(row[k], alias_value("x1", alias_flat_of({4, 5}, {2, k})));
}

struct AliasRuleCase {
  const char* what;
  std::vector<TensorMeta> view;
  std::vector<TensorAlias> aliases;
  const char* code;
};

TEST(AliasView, EachRuleIsANamedError) {
  AliasValueSource src;
  src.add("a", {2, 3});
  src.add("h", {2, 3}, {}, DType::kBF16);
  const Box all = Box::whole({2, 3});
  const std::vector<AliasRuleCase> cases = {
      {"view tensor unknown", {{"v", DType::kF32, {2, 3}}}, {{"nope", all, "a", all}}, "BadAlias"},
      {"source tensor unknown", {{"v", DType::kF32, {2, 3}}}, {{"v", all, "missing", all}}, "BadAlias"},
      {"view box outside", {{"v", DType::kF32, {2, 3}}}, {{"v", abox({1, 0}, {2, 3}), "a", all}}, "BadAlias"},
      {"source box outside", {{"v", DType::kF32, {2, 3}}}, {{"v", all, "a", abox({0, 1}, {2, 3})}}, "BadAlias"},
      {"extents differ", {{"v", DType::kF32, {3, 2}}}, {{"v", Box::whole({3, 2}), "a", all}}, "BadAlias"},
      {"dtype differs", {{"v", DType::kF32, {2, 3}}}, {{"v", all, "h", all}}, "BadAlias"},
      {"gap", {{"v", DType::kF32, {4, 3}}}, {{"v", all, "a", all}}, "BadAlias"},
      {"overlap",
       {{"v", DType::kF32, {2, 3}}},
       {{"v", all, "a", all}, {"v", abox({0, 0}, {1, 3}), "a", abox({1, 0}, {1, 3})}},
       "BadAlias"},
  };
  for (const auto& c : cases) EXPECT_EQ(alias_code_of(make_alias_view(src, c.view, c.aliases)), c.code) << c.what;
  EXPECT_EQ(alias_code_of(make_alias_view(src, {{"v", DType::kF32, {2, 3}}}, {{"v", all, "a", all}})), "ok");
}

TEST(AliasView, FlatSourcePiecesAreRefused) {
  AliasValueSource src;
  src.add("z", {2, 3}, {Region{Box::whole({2, 3}), 0, 4}, Region{Box::whole({2, 3}), 4, 6}});
  auto view = make_alias_view(src, {{"v", DType::kF32, {2, 3}}}, {{"v", Box::whole({2, 3}), "z", Box::whole({2, 3})}});
  ASSERT_FALSE(view.ok());
  EXPECT_EQ(view.status().kind(), ErrorKind::kUnsupported) << view.status().to_string();
}

}  // namespace
}  // namespace ckpt
