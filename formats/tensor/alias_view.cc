#include "formats/tensor/alias_view.h"

#include <map>
#include <utility>

#include "formats/tensor/tiling.h"

namespace ckpt {

namespace {

Status bad_alias(const std::string& view, const std::string& what) {
  return Status::Error("BadAlias", "view tensor '" + view + "': " + what).with_tensor(view);
}

// An alias with its dimension pairing: the source dimension of each view dimension of extent > 1
// (-1 for the view's unit dimensions); view and source agree once unit dimensions are dropped.
struct AliasMapped {
  TensorAlias a;
  std::vector<int> src_dim;   // size view rank: the source dimension each view dimension follows, -1: none (extent 1)
  std::vector<int> view_dim;  // size source rank: the reverse
};

Result<AliasMapped> alias_pair_dims(TensorAlias a) {
  std::vector<size_t> vs, ss;
  for (size_t d = 0; d < a.view_box.ndim(); ++d)
    if (a.view_box.extent[d] != 1) vs.push_back(d);
  for (size_t d = 0; d < a.src_box.ndim(); ++d)
    if (a.src_box.extent[d] != 1) ss.push_back(d);
  bool same = vs.size() == ss.size();
  for (size_t k = 0; same && k < vs.size(); ++k) same = a.view_box.extent[vs[k]] == a.src_box.extent[ss[k]];
  if (!same)
    return bad_alias(a.view, "box " + a.view_box.to_string() + " and box " + a.src_box.to_string() + " of '" + a.src +
                                 "' differ in more than dimensions of extent 1");
  AliasMapped m{std::move(a), {}, {}};
  m.src_dim.assign(m.a.view_box.ndim(), -1);
  m.view_dim.assign(m.a.src_box.ndim(), -1);
  for (size_t k = 0; k < vs.size(); ++k) m.src_dim[vs[k]] = static_cast<int>(ss[k]), m.view_dim[ss[k]] = static_cast<int>(vs[k]);
  return m;
}

// Box `b` inside `from` carried to its place inside `to`: dimension d of `to` follows dimension
// follow[d] of `from` (offset relative to the base boxes, same extent); -1 keeps `to`'s.
Box carry_box(const Box& from, const Box& to, const std::vector<int>& follow, const Box& b) {
  Box r = to;
  for (size_t d = 0; d < r.ndim(); ++d) {
    if (follow[d] < 0) continue;
    const size_t s = static_cast<size_t>(follow[d]);
    r.offset[d] = to.offset[d] + (b.offset[s] - from.offset[s]);
    r.extent[d] = b.extent[s];
  }
  return r;
}

// The view box of the source box `b` (inside m.a.src_box), and the reverse.
Box alias_to_view(const AliasMapped& m, const Box& b) { return carry_box(m.a.src_box, m.a.view_box, m.src_dim, b); }
Box alias_to_src(const AliasMapped& m, const Box& v) { return carry_box(m.a.view_box, m.a.src_box, m.view_dim, v); }

class AliasView final : public TensorSource {
 public:
  AliasView(TensorSource& inner, std::vector<TensorMeta> tensors, std::unique_ptr<TensorSource> owned = nullptr)
      : owned_(std::move(owned)), inner_(inner), tensors_(std::move(tensors)) {}

  Status build(std::vector<TensorAlias> aliases);

  const std::vector<TensorMeta>& tensors() const override { return tensors_; }
  const std::vector<Piece>& pieces() const override { return pieces_; }
  Status read(size_t piece, const Box& sub, void* dst) override {
    if (piece >= map_.size()) return Status::Internal("alias view: piece " + std::to_string(piece) + " out of range");
    return inner_.read(map_[piece].first, alias_to_src(mapped_[map_[piece].second], sub), dst);
  }
  std::optional<FileExtent> file_extent(size_t piece, const Box& sub) override {
    if (piece >= map_.size()) return std::nullopt;
    return inner_.file_extent(map_[piece].first, alias_to_src(mapped_[map_[piece].second], sub));
  }
  const nlohmann::json& metadata() const override { return inner_.metadata(); }
  std::string describe() const override { return inner_.describe(); }
  IntegrityInfo integrity() const override { return inner_.integrity(); }
  CheckReport check(const CheckOptions& o) override { return check_of_inner(inner_, o, false); }
  Status check_piece(size_t piece) override {
    if (piece >= map_.size()) return Status::Internal("alias view: piece " + std::to_string(piece) + " out of range");
    return inner_.check_piece(map_[piece].first);
  }
  std::optional<RangeCheck> range_check(size_t piece) override {
    return piece < map_.size() ? inner_.range_check(map_[piece].first) : std::nullopt;
  }
  PieceStorage piece_storage(size_t piece) override {
    return piece < map_.size() ? inner_.piece_storage(map_[piece].first) : PieceStorage{};
  }
  void set_read_threads(int threads) override { inner_.set_read_threads(threads); }
  uint64_t read_memory(int threads) const override { return inner_.read_memory(threads); }

 private:
  std::unique_ptr<TensorSource> owned_;  // inner_ when the view owns it
  TensorSource& inner_;
  std::vector<TensorMeta> tensors_;
  std::vector<AliasMapped> mapped_;
  std::vector<Piece> pieces_;
  std::vector<std::pair<size_t, size_t>> map_;  // view piece -> (inner piece, alias)
};

Status AliasView::build(std::vector<TensorAlias> aliases) {
  std::map<std::string, const TensorMeta*> views, srcs;
  for (const auto& t : tensors_) views[t.name] = &t;
  for (const auto& t : inner_.tensors()) srcs[t.name] = &t;
  std::map<std::string, std::vector<size_t>> src_pieces;
  for (size_t i = 0; i < inner_.pieces().size(); ++i) src_pieces[inner_.pieces()[i].tensor].push_back(i);
  std::map<std::string, std::vector<Region>> covered;
  for (auto& a : aliases) {
    auto v = views.find(a.view);
    auto s = srcs.find(a.src);
    if (v == views.end()) return bad_alias(a.view, "not a tensor of the view");
    if (s == srcs.end()) return bad_alias(a.view, "its source tensor '" + a.src + "' is not in '" + inner_.describe() + "'");
    if (Status st = validate_box(a.view_box, v->second->shape); !st.ok()) return bad_alias(a.view, std::string(st.message()));
    if (Status st = validate_box(a.src_box, s->second->shape); !st.ok())
      return bad_alias(a.view, "box of '" + a.src + "': " + std::string(st.message()));
    if (v->second->dtype != s->second->dtype)
      return bad_alias(a.view, std::string("dtype ") + std::string(dtype_name(v->second->dtype)) + " but its source '" + a.src + "' is " +
                                   std::string(dtype_name(s->second->dtype)));
    CKPT_ASSIGN_OR_RETURN(AliasMapped m, alias_pair_dims(std::move(a)));
    covered[m.a.view].push_back(Region{m.a.view_box});
    mapped_.push_back(std::move(m));
  }
  for (const auto& t : tensors_)
    if (auto fault = find_tiling_fault(t.shape, covered[t.name]); fault)
      return bad_alias(t.name, fault->kind == TilingFault::Kind::kGap
                                   ? "its aliases hold " + std::to_string(fault->covered) + " of its " +
                                         std::to_string(fault->total) + " elements"
                                   : "its aliases overlap or leave the tensor (" + fault->detail + ")");
  for (size_t k = 0; k < mapped_.size(); ++k) {
    const AliasMapped& m = mapped_[k];
    for (size_t i : src_pieces[m.a.src]) {
      const Piece& p = inner_.pieces()[i];
      if (p.region.is_flat())
        return Status::Unsupported("'" + inner_.describe() + "' stores tensor '" + p.tensor +
                                   "' as flat ranges, which a renamed view cannot take apart")
            .with_tensor(p.tensor);
      auto part = intersect(p.region.box, m.a.src_box);
      if (!part) continue;
      pieces_.push_back(Piece{m.a.view, Region{alias_to_view(m, *part)}, p.dtype});
      map_.emplace_back(i, k);
    }
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<TensorSource>> make_alias_view(TensorSource& inner, std::vector<TensorMeta> tensors,
                                                      std::vector<TensorAlias> aliases) {
  auto view = std::make_unique<AliasView>(inner, std::move(tensors));
  CKPT_RETURN_IF_ERROR(view->build(std::move(aliases)));
  return std::unique_ptr<TensorSource>(std::move(view));
}

Result<std::unique_ptr<TensorSource>> make_alias_view(std::unique_ptr<TensorSource> inner, std::vector<TensorMeta> tensors,
                                                      std::vector<TensorAlias> aliases) {
  TensorSource& ref = *inner;
  auto view = std::make_unique<AliasView>(ref, std::move(tensors), std::move(inner));
  CKPT_RETURN_IF_ERROR(view->build(std::move(aliases)));
  return std::unique_ptr<TensorSource>(std::move(view));
}

}  // namespace ckpt
