// The geometry of profile tensors and the canonical view (converters/profile/profile_view.h).
#include "converters/profile/profile_view.h"
#include "converters/profile/transpose_tile.h"
#include "formats/base/file_io.h"
#include "reshard/staged_read.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

namespace ckpt {

namespace profile_view_detail {

Shape concat_shape(const ProfileTensor& t) {
  Shape s = t.shape;
  if (t.transposed && s.size() == 2) std::swap(s[0], s[1]);
  return s;
}

Box stored_to_concat(const ProfileTensor& t, const Box& b) {
  if (!t.transposed || b.ndim() != 2) return b;
  return Box{{b.offset[1], b.offset[0]}, {b.extent[1], b.extent[0]}};
}

Box concat_to_canonical(const ProfileSegment& s, int64_t row0, const Box& c) {
  Box out = c;
  for (size_t d = 0; d < c.ndim(); ++d) out.offset[d] = c.offset[d] + s.box.offset[d] - (d == 0 ? row0 : 0);
  return out;
}

Box canonical_to_concat(const ProfileSegment& s, int64_t row0, const Box& k) {
  Box out = k;
  for (size_t d = 0; d < k.ndim(); ++d) out.offset[d] = k.offset[d] - s.box.offset[d] + (d == 0 ? row0 : 0);
  return out;
}

bool is_identity(const ProfileTensor& t, const Shape& canonical_shape) {
  return !t.transposed && t.segments.size() == 1 && !t.segments[0].canonical.empty() &&
         t.segments[0].box == Box::whole(canonical_shape) && t.shape == canonical_shape;
}

Result<bool> gather_column_band(TensorSource& src, size_t piece, const Box& sub, uint8_t* dst) {
  const Piece& p = src.pieces()[piece];
  if (p.region.is_flat() || p.region.box.ndim() != 2 || sub.ndim() != 2) return false;
  const Box& pb = p.region.box;
  const int64_t R = sub.extent[0], C = sub.extent[1], W = pb.extent[1];
  if (C >= W || R == 0 || C == 0) return false;
  const Box rows{{sub.offset[0], pb.offset[1]}, {R, W}};
  const uint64_t es = dtype_size(p.dtype), row_b = static_cast<uint64_t>(W) * es, band_b = static_cast<uint64_t>(C) * es;
  const uint64_t band_off = static_cast<uint64_t>(sub.offset[1] - pb.offset[1]) * es;
  std::optional<FileExtent> e = src.file_extent(piece, rows);
  if (!e || e->bytes != static_cast<uint64_t>(R) * row_b) return false;
  uint64_t pos = 0;  // bytes of the range seen so far
  Status st = read_file_blocks(e->fd, e->offset, e->bytes, src.describe(), [&](const void* blk, size_t n) {
    const auto* b = static_cast<const uint8_t*>(blk);
    const uint64_t lo = pos, hi = pos + n;
    for (uint64_t r = lo / row_b; r < static_cast<uint64_t>(R) && r * row_b < hi; ++r) {
      const uint64_t s = std::max(lo, r * row_b + band_off), t = std::min(hi, r * row_b + band_off + band_b);
      if (s < t) std::memcpy(dst + r * band_b + (s - r * row_b - band_off), b + (s - lo), t - s);
    }
    pos = hi;
  });
  if (!st.ok()) return std::move(st).with_tensor(p.tensor);
  return true;
}

uint8_t* tile_scratch(int slot, size_t bytes) {
  thread_local std::vector<uint8_t> bufs[4];
  std::vector<uint8_t>& b = bufs[slot];
  if (b.size() < bytes) b.resize(bytes);
  return b.data();
}

}  // namespace profile_view_detail

namespace {

namespace pvd = profile_view_detail;

// The canonical tensor padding rows of `pt` pad (its first non-padding segment).
std::string padded_tensor_name(const ProfileTensor& pt) {
  for (const ProfileSegment& s : pt.segments)
    if (!s.canonical.empty()) return s.canonical;
  return pt.name;
}

Status profile_mismatch(const std::string& src, const std::string& msg) {
  return Status::Error("ProfileTensorMismatch", "'" + src + "': " + msg);
}

// Transposed pieces are also staged reads (reshard/staged_read.h): the stored rows are read on
// the executor's reading thread and transposed by a worker.
class CanonicalViewImpl final : public CanonicalView, public StagedReads {
 public:
  const std::vector<TensorMeta>& tensors() const override { return tensors_; }
  const std::vector<Piece>& pieces() const override { return pieces_; }
  const nlohmann::json& metadata() const override { return meta_; }
  std::string describe() const override { return src_->describe(); }
  IntegrityInfo integrity() const override { return src_->integrity(); }
  CheckReport check(const CheckOptions& o) override { return check_of_inner(*src_, o, false); }
  Status check_piece(size_t piece) override {
    if (piece >= map_.size()) return Status::Internal("canonical view piece " + std::to_string(piece) + " out of range");
    return src_->check_piece(map_[piece].src);
  }
  void set_read_threads(int threads) override { src_->set_read_threads(threads); }
  std::optional<RangeCheck> range_check(size_t piece) override {
    return piece < map_.size() ? src_->range_check(map_[piece].src) : std::nullopt;
  }
  uint64_t read_memory(int threads) const override { return src_->read_memory(threads); }

  Status read(size_t piece, const Box& sub, void* dst) override {
    if (piece >= pieces_.size()) return Status::Internal("canonical view piece " + std::to_string(piece) + " out of range");
    const Map& m = map_[piece];
    if (m.identity) return src_->read(m.src, sub, dst);
    const ProfileTensor& pt = pts_[m.pt];
    const Box cb = pvd::canonical_to_concat(pt.segments[m.seg], m.row0, sub);
    if (!pt.transposed) return src_->read(m.src, cb, dst);
    return read_transposed(m.src, pt, cb, static_cast<uint8_t*>(dst));
  }

  uint64_t staged_bytes(size_t piece, const Box& sub) override {
    if (piece >= pieces_.size() || sub.ndim() != 2 || map_[piece].identity || !pts_[map_[piece].pt].transposed) return 0;
    return static_cast<uint64_t>(sub.numel()) * dtype_size(src_->pieces()[map_[piece].src].dtype);
  }

  // The stage: the stored box [C, R] of canonical box `sub` [R, C], as stored.
  Status read_stage(size_t piece, const Box& sub, void* stage) override {
    if (staged_bytes(piece, sub) == 0) return Status::Internal("canonical view piece " + std::to_string(piece) + " is not staged");
    const Map& m = map_[piece];
    const ProfileTensor& pt = pts_[m.pt];
    const Box sb = pvd::concat_to_stored(pt, pvd::canonical_to_concat(pt.segments[m.seg], m.row0, sub));
    CKPT_ASSIGN_OR_RETURN(bool gathered, pvd::gather_column_band(*src_, m.src, sb, static_cast<uint8_t*>(stage)));
    return gathered ? Status::Ok() : src_->read(m.src, sb, stage);
  }

  Status finish_stage(size_t piece, const Box& sub, const void* stage, void* dst, int64_t ld) override {
    if (staged_bytes(piece, sub) == 0) return Status::Internal("canonical view piece " + std::to_string(piece) + " is not staged");
    transpose_tile(static_cast<const uint8_t*>(stage), sub.extent[1], sub.extent[0], static_cast<uint8_t*>(dst), ld,
                   dtype_size(src_->pieces()[map_[piece].src].dtype));
    return Status::Ok();
  }

  std::optional<FileExtent> file_extent(size_t piece, const Box& sub) override {
    if (piece >= pieces_.size()) return std::nullopt;
    const Map& m = map_[piece];
    if (m.identity) return src_->file_extent(m.src, sub);
    const ProfileTensor& pt = pts_[m.pt];
    if (pt.transposed) return std::nullopt;
    return src_->file_extent(m.src, pvd::canonical_to_concat(pt.segments[m.seg], m.row0, sub));
  }

  Status check_padding(ExactnessReport& report) override {
    for (const Padding& p : padding_) {
      const DType dt = src_->pieces()[p.src].dtype;
      const size_t es = dtype_size(dt);
      ExactnessEntry e{p.canonical, pts_[p.pt].name, "dropped padding rows"};
      // Row slabs of the stored box, at most tile_ bytes each.
      const int64_t rows = p.stored.extent[0];
      const int64_t row_elems = rows > 0 ? p.stored.numel() / rows : 0;
      const int64_t step = std::max<int64_t>(1, static_cast<int64_t>(tile_ / std::max<uint64_t>(1, row_elems * es)));
      std::vector<uint8_t> buf;
      std::vector<double> vals;
      for (int64_t r = 0; r < rows && row_elems > 0; r += step) {
        Box slab = p.stored;
        slab.offset[0] += r;
        slab.extent[0] = std::min(step, rows - r);
        const int64_t n = slab.numel();
        buf.resize(static_cast<size_t>(n) * es);
        vals.resize(static_cast<size_t>(n));
        CKPT_RETURN_IF_ERROR(src_->read(p.src, slab, buf.data()));
        CKPT_RETURN_IF_ERROR(cast_elements(buf.data(), dt, vals.data(), DType::kF64, static_cast<size_t>(n)));
        for (double v : vals)
          if (v != 0) {
            ++e.changed;
            e.max_abs = std::max(e.max_abs, std::isnan(v) ? INFINITY : std::fabs(v));
            e.max_rel = 1;
          }
        e.elements += static_cast<uint64_t>(n);
      }
      report.add(e);
    }
    return Status::Ok();
  }

  static Result<std::unique_ptr<CanonicalView>> make(TensorSource& src, std::unique_ptr<TensorSource> owner,
                                                     const std::vector<TensorMeta>& canonical,
                                                     const std::vector<ProfileTensor>& pts, nlohmann::json metadata,
                                                     uint64_t tile) {
    auto v = std::unique_ptr<CanonicalViewImpl>(new CanonicalViewImpl());
    v->src_ = &src;
    v->owner_ = std::move(owner);
    v->pts_ = pts;
    v->meta_ = std::move(metadata);
    v->tile_ = std::max<uint64_t>(tile, 1);
    CKPT_RETURN_IF_ERROR(v->build(canonical));
    return std::unique_ptr<CanonicalView>(std::move(v));
  }

 private:
  struct Map {
    size_t src = 0;  // source piece
    size_t pt = 0, seg = 0;
    int64_t row0 = 0;  // first row of the segment in the concatenation
    bool identity = false;
  };
  struct Padding {
    size_t src = 0, pt = 0;
    std::string canonical;  // the tensor the padding pads (for the report)
    Box stored;             // padding rows of the piece, stored coordinates
  };

  CanonicalViewImpl() = default;

  // Reads concatenation box `cb` of a transposed tensor: stored rows (= concatenation columns) in
  // tiles, each transposed into its columns of dst.
  Status read_transposed(size_t src_piece, const ProfileTensor& pt, const Box& cb, uint8_t* dst) {
    const size_t es = dtype_size(src_->pieces()[src_piece].dtype);
    const Box sb = pvd::concat_to_stored(pt, cb);  // [C, R]
    const int64_t C = sb.extent[0], R = sb.extent[1];
    if (C == 0 || R == 0) return Status::Ok();
    const int64_t step = std::max<int64_t>(1, static_cast<int64_t>(tile_ / (static_cast<uint64_t>(R) * es)));
    uint8_t* tmp = pvd::tile_scratch(3, static_cast<size_t>(std::min(step, C) * R) * es);
    for (int64_t c = 0; c < C; c += step) {
      Box t = sb;
      t.offset[0] += c;
      t.extent[0] = std::min(step, C - c);
      CKPT_RETURN_IF_ERROR(src_->read(src_piece, t, tmp));
      transpose_tile(tmp, t.extent[0], R, dst + static_cast<size_t>(c) * es, C, es);
    }
    return Status::Ok();
  }

  Status build(const std::vector<TensorMeta>& canonical) {
    std::map<std::string, size_t> pt_of, canon_of;
    for (size_t i = 0; i < pts_.size(); ++i) pt_of[pts_[i].name] = i;
    for (size_t i = 0; i < canonical.size(); ++i) canon_of[canonical[i].name] = i;
    std::vector<int> dtype_of(canonical.size(), -1);
    for (const TensorMeta& t : src_->tensors()) {
      auto it = pt_of.find(t.name);
      if (it == pt_of.end()) return profile_mismatch(src_->describe(), "tensor '" + t.name + "' is no tensor of the profile");
      if (pts_[it->second].shape != t.shape)
        return profile_mismatch(src_->describe(), "tensor '" + t.name + "' has shape " + shape_to_string(t.shape) +
                                                      ", the profile stores it as " + shape_to_string(pts_[it->second].shape));
      for (const ProfileSegment& s : pts_[it->second].segments) {
        if (s.canonical.empty()) continue;
        auto c = canon_of.find(s.canonical);
        if (c == canon_of.end()) return Status::Internal("profile segment of unknown canonical tensor '" + s.canonical + "'");
        if (dtype_of[c->second] < 0) dtype_of[c->second] = static_cast<int>(t.dtype);
      }
    }
    for (size_t i = 0; i < canonical.size(); ++i) {
      if (dtype_of[i] < 0)
        return profile_mismatch(src_->describe(), "no tensor of the profile holds '" + canonical[i].name + "'");
      TensorMeta t = canonical[i];
      t.dtype = static_cast<DType>(dtype_of[i]);
      tensors_.push_back(std::move(t));
    }
    for (size_t i = 0; i < src_->pieces().size(); ++i) {
      const Piece& p = src_->pieces()[i];
      const size_t k = pt_of.at(p.tensor);
      add_piece(i, k, canonical, canon_of);
    }
    return Status::Ok();
  }

  void add_piece(size_t i, size_t k, const std::vector<TensorMeta>& canonical, const std::map<std::string, size_t>& canon_of) {
    const Piece& p = src_->pieces()[i];
    const ProfileTensor& pt = pts_[k];
    if (pt.segments.size() == 1 && !pt.segments[0].canonical.empty() &&
        pvd::is_identity(pt, canonical[canon_of.at(pt.segments[0].canonical)].shape)) {
      pieces_.push_back({pt.segments[0].canonical, p.region, p.dtype});
      map_.push_back({i, k, 0, 0, true});
      return;
    }
    for (const Box& b : p.region.boxes()) {
      const Box cb = pvd::stored_to_concat(pt, b);
      int64_t row0 = 0;
      for (size_t s = 0; s < pt.segments.size(); ++s) {
        const ProfileSegment& seg = pt.segments[s];
        const int64_t rows = seg.rows();
        Box span = cb;
        if (span.ndim() > 0) {
          span.offset[0] = row0;
          span.extent[0] = rows;
        }
        row0 += rows;
        auto x = intersect(cb, span);
        if (!x) continue;
        if (seg.canonical.empty()) {
          padding_.push_back({i, k, padded_tensor_name(pt), pvd::concat_to_stored(pt, *x)});
          continue;
        }
        pieces_.push_back({seg.canonical, Region{pvd::concat_to_canonical(seg, row0 - rows, *x)}, p.dtype});
        map_.push_back({i, k, s, row0 - rows, false});
      }
    }
  }

  TensorSource* src_ = nullptr;
  std::unique_ptr<TensorSource> owner_;
  std::vector<ProfileTensor> pts_;
  std::vector<TensorMeta> tensors_;
  std::vector<Piece> pieces_;
  std::vector<Map> map_;
  std::vector<Padding> padding_;
  nlohmann::json meta_;
  uint64_t tile_ = kProfileTileBytes;
};

}  // namespace

Result<std::unique_ptr<CanonicalView>> make_canonical_view(TensorSource& src, std::unique_ptr<TensorSource> owner,
                                                           const std::vector<TensorMeta>& canonical,
                                                           const std::vector<ProfileTensor>& pts,
                                                           nlohmann::json metadata, uint64_t tile_bytes) {
  return CanonicalViewImpl::make(src, std::move(owner), canonical, pts, std::move(metadata), tile_bytes);
}

}  // namespace ckpt
