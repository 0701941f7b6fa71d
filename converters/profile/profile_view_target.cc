// The profile view: canonical tensors presented in a target profile (converters/profile/profile_view.h).
#include <algorithm>
#include <cstring>
#include <map>

#include "converters/profile/profile_view.h"
#include "converters/profile/transpose_tile.h"
#include "formats/base/file_io.h"
#include "reshard/staged_read.h"

namespace ckpt {

namespace {

namespace pvt = profile_view_detail;

// Transposed tensors are also staged reads (reshard/staged_read.h): the executor reads the
// canonical box on its reading thread and a worker casts and transposes it into the chunk. When
// no cast is needed and the canonical piece's rows lie in one file range (a native store's
// contiguous dataset), nothing is read ahead: the worker maps the box's rows and transposes
// straight from the page cache (formats/base/file_io.h with_mapped_range), one copy of each byte
// fewer than reading them into the stage (perf: docs/BENCHMARKS.md "Profile conversion").
class ProfileViewImpl final : public ProfileView, public StagedReads {
 public:
  const std::vector<TensorMeta>& tensors() const override { return tensors_; }
  const std::vector<Piece>& pieces() const override { return pieces_; }
  const nlohmann::json& metadata() const override { return meta_; }
  std::string describe() const override { return src_->describe(); }
  ExactnessReport report() const override { return tracker_.snapshot(); }
  const std::vector<ProfileTensor>& stored_tensors() const override { return pts_; }
  IntegrityInfo integrity() const override { return src_->integrity(); }
  CheckReport check(const CheckOptions& o) override { return check_of_inner(*src_, o, false); }
  Status check_piece(size_t piece) override {
    if (piece >= map_.size()) return Status::Internal("profile view piece " + std::to_string(piece) + " out of range");
    return map_[piece].zero ? Status::Ok() : src_->check_piece(map_[piece].src);
  }
  void set_read_threads(int threads) override { src_->set_read_threads(threads); }
  // None: its pieces are computed (cast, transposed, zero), not copied from the stored ranges.
  uint64_t read_memory(int threads) const override { return src_->read_memory(threads); }

  Status read(size_t piece, const Box& sub, void* dst_v) override {
    if (piece >= pieces_.size()) return Status::Internal("profile view piece " + std::to_string(piece) + " out of range");
    const Map& m = map_[piece];
    const ProfileTensor& pt = pts_[m.pt];
    auto* dst = static_cast<uint8_t*>(dst_v);
    if (m.zero) {
      std::memset(dst, 0, static_cast<size_t>(sub.numel()) * dtype_size(pt.dtype));
      return Status::Ok();
    }
    const ProfileSegment& seg = pt.segments[m.seg];
    const Box csub = canonical_box(m, sub);
    const DType sd = src_->pieces()[m.src].dtype;
    ExactnessEntry e{seg.canonical, pt.name, cast_step_name(sd, pt.dtype)};
    Status st = pt.transposed ? read_transposed(m.src, sd, pt.dtype, csub, dst, e)
                              : read_straight(m.src, sd, pt.dtype, csub, dst, e);
    if (e.elements > 0) tracker_.add(e);
    if (st.ok() && e.clamped > 0 && stop_on_overflow_) st = overflow_stop(e);
    if (!st.ok())
      return std::move(st).with_context("tensor '" + seg.canonical + "' (stored as '" + pt.name + "')");
    return st;
  }

  // Staged: a transposed piece (the stage is the canonical box [R, C] in the canonical dtype), or
  // a same-dtype piece of a source whose read of it is staged (the canonical view of a transposed
  // source), passed through.
  uint64_t staged_bytes(size_t piece, const Box& sub) override {
    if (piece >= pieces_.size() || sub.ndim() != 2) return 0;
    const Map& m = map_[piece];
    if (m.zero) return 0;
    if (m.rows) return 1;  // mapped in finish_stage: the stage holds nothing
    if (pts_[m.pt].transposed) return static_cast<uint64_t>(sub.numel()) * dtype_size(src_->pieces()[m.src].dtype);
    if (!src_staged_ || src_->pieces()[m.src].dtype != pts_[m.pt].dtype) return 0;
    return src_staged_->staged_bytes(m.src, canonical_box(m, sub));
  }

  Status read_stage(size_t piece, const Box& sub, void* stage) override {
    if (staged_bytes(piece, sub) == 0) return Status::Internal("profile view piece " + std::to_string(piece) + " is not staged");
    const Map& m = map_[piece];
    const ProfileTensor& pt = pts_[m.pt];
    const ProfileSegment& seg = pt.segments[m.seg];
    const Box csub = canonical_box(m, sub);
    Status st;
    if (m.rows) {
      st = Status::Ok();  // finish_stage maps the rows
    } else if (!pt.transposed) {
      st = src_staged_->read_stage(m.src, csub, stage);
    } else {
      Result<bool> gathered = pvt::gather_column_band(*src_, m.src, csub, static_cast<uint8_t*>(stage));
      st = !gathered.ok() ? gathered.take_status() : *gathered ? Status::Ok() : src_->read(m.src, csub, stage);
    }
    if (!st.ok()) return std::move(st).with_context("tensor '" + seg.canonical + "' (stored as '" + pt.name + "')");
    return st;
  }

  Status finish_stage(size_t piece, const Box& sub, const void* stage, void* dst, int64_t ld) override {
    if (staged_bytes(piece, sub) == 0) return Status::Internal("profile view piece " + std::to_string(piece) + " is not staged");
    const Map& m = map_[piece];
    const ProfileTensor& pt = pts_[m.pt];
    const ProfileSegment& seg = pt.segments[m.seg];
    if (!pt.transposed) return src_staged_->finish_stage(m.src, canonical_box(m, sub), stage, dst, ld);
    const DType sd = src_->pieces()[m.src].dtype;
    if (m.rows) return transpose_mapped(m, canonical_box(m, sub), static_cast<uint8_t*>(dst), ld);
    ExactnessEntry e{seg.canonical, pt.name, cast_step_name(sd, pt.dtype)};
    Status st = cast_transpose(static_cast<const uint8_t*>(stage), sd, pt.dtype, sub.extent[1], sub.extent[0],
                               static_cast<uint8_t*>(dst), ld, e);
    if (e.elements > 0) tracker_.add(e);
    if (!st.ok()) return std::move(st).with_context("tensor '" + seg.canonical + "' (stored as '" + pt.name + "')");
    return st;
  }

  std::optional<FileExtent> file_extent(size_t piece, const Box& sub) override {
    if (piece >= pieces_.size()) return std::nullopt;
    const Map& m = map_[piece];
    const ProfileTensor& pt = pts_[m.pt];
    if (m.zero || pt.transposed || src_->pieces()[m.src].dtype != pt.dtype) return std::nullopt;
    if (m.identity) return src_->file_extent(m.src, sub);
    return src_->file_extent(m.src, pvt::concat_to_canonical(pt.segments[m.seg], m.row0, sub));
  }

  static Result<std::unique_ptr<ProfileView>> make(TensorSource& src, std::unique_ptr<TensorSource> owner,
                                                   const std::vector<ProfileTensor>& pts, nlohmann::json metadata,
                                                   const CastOptions& cast, uint64_t tile) {
    auto v = std::unique_ptr<ProfileViewImpl>(new ProfileViewImpl());
    v->src_ = &src;
    v->owner_ = std::move(owner);
    v->pts_ = pts;
    v->meta_ = std::move(metadata);
    v->cast_ = cast;
    v->stop_on_overflow_ = cast.overflow == OverflowPolicy::kError;  // the first overflowing read fails
    v->cast_.overflow = OverflowPolicy::kSaturate;  // clamped values are counted; the caller decides
    v->tile_ = std::max<uint64_t>(tile, 1);
    v->src_staged_ = dynamic_cast<StagedReads*>(&src);
    CKPT_RETURN_IF_ERROR(v->build());
    return std::unique_ptr<ProfileView>(std::move(v));
  }

 private:
  struct Map {
    size_t src = 0;  // canonical piece
    size_t pt = 0, seg = 0;
    int64_t row0 = 0;
    bool identity = false, zero = false;
    // Transposed, same dtype, and the canonical piece's rows stored back to back in this range:
    // staged reads transpose from a mapping of it (transpose_mapped).
    std::optional<FileExtent> rows;
  };

  ProfileViewImpl() = default;

  // Canonical box `csub` [R, C] of piece m.src into dst [C, R] (rows `ld` apart), transposed from
  // mappings of the stored rows (whole piece width; a column band is a strided transpose), at
  // most kMappedRowBytes of them at a time (bounds the mapped pages, RssFile).
  Status transpose_mapped(const Map& m, const Box& csub, uint8_t* dst, int64_t ld) const {
    constexpr uint64_t kMappedRowBytes = 8ull << 20;
    const Box& pb = src_->pieces()[m.src].region.box;
    const uint64_t es = dtype_size(pts_[m.pt].dtype), W = static_cast<uint64_t>(pb.extent[1]);
    const int64_t R = csub.extent[0], C = csub.extent[1];
    const uint64_t r0 = static_cast<uint64_t>(csub.offset[0] - pb.offset[0]), c0 = static_cast<uint64_t>(csub.offset[1] - pb.offset[1]);
    const int64_t step = std::max<int64_t>(1, static_cast<int64_t>(kMappedRowBytes / std::max<uint64_t>(1, W * es)));
    Status st;
    for (int64_t r = 0; r < R && st.ok(); r += step) {
      const int64_t k = std::min(step, R - r);
      st = with_mapped_range(m.rows->fd, m.rows->offset + (r0 + static_cast<uint64_t>(r)) * W * es, static_cast<uint64_t>(k) * W * es,
                             src_->describe(), [&](const uint8_t* rows) {
                               transpose_tile_strided(rows + c0 * es, static_cast<int64_t>(W), k, C, dst + static_cast<uint64_t>(r) * es, ld, es);
                             });
    }
    if (!st.ok()) return std::move(st).with_context("tensor '" + pts_[m.pt].segments[m.seg].canonical + "' (stored as '" + pts_[m.pt].name + "')");
    return st;
  }

  // The range of a transposed piece's canonical rows, when it is mapped instead of staged.
  std::optional<FileExtent> mapped_rows(const Map& m) {
    const Piece& p = src_->pieces()[m.src];
    if (m.zero || !pts_[m.pt].transposed || p.dtype != pts_[m.pt].dtype || p.region.is_flat() || p.region.box.ndim() != 2)
      return std::nullopt;
    std::optional<FileExtent> e = src_->file_extent(m.src, p.region.box);
    if (!e || e->bytes != static_cast<uint64_t>(p.region.box.numel()) * dtype_size(p.dtype)) return std::nullopt;
    return e;
  }

  // The canonical box a box of a (non-zero) piece reads.
  Box canonical_box(const Map& m, const Box& sub) const {
    const ProfileTensor& pt = pts_[m.pt];
    return m.identity ? sub : pvt::concat_to_canonical(pt.segments[m.seg], m.row0, pvt::stored_to_concat(pt, sub));
  }

  // Canonical box `csub` in storage order: flat runs of at most a tile, each read and cast.
  Status read_straight(size_t sp, DType sd, DType dd, const Box& csub, uint8_t* dst, ExactnessEntry& e) {
    if (sd == dd) return src_->read(sp, csub, dst);
    const size_t ss = dtype_size(sd), ds = dtype_size(dd);
    const int64_t n = csub.numel();
    const int64_t step = std::max<int64_t>(1, static_cast<int64_t>(tile_ / ss));
    uint8_t* tmp = pvt::tile_scratch(0, static_cast<size_t>(std::min(step, n)) * ss);
    for (int64_t b = 0; b < n; b += step) {
      const int64_t end = std::min(n, b + step);
      size_t at = 0;
      for (const Box& x : flat_range_to_boxes(csub, b, end)) {
        CKPT_RETURN_IF_ERROR(src_->read(sp, x, tmp + at));
        at += static_cast<size_t>(x.numel()) * ss;
      }
      CKPT_RETURN_IF_ERROR(tracked_cast(tmp, sd, dst + static_cast<size_t>(b) * ds, dd,
                                        static_cast<size_t>(end - b), cast_, e));
    }
    return Status::Ok();
  }

  // Rows x C elements (dtype sd, dense) into dst [C, rows] (rows `ld` apart), cast to dd in row
  // tiles of at most a tile (thread-local scratch, slot 2) when the dtypes differ.
  Status cast_transpose(const uint8_t* src, DType sd, DType dd, int64_t rows, int64_t C, uint8_t* dst, int64_t ld,
                        ExactnessEntry& e) {
    const size_t ss = dtype_size(sd), ds = dtype_size(dd);
    if (sd == dd) {
      transpose_tile(src, rows, C, dst, ld, ds);
      return Status::Ok();
    }
    const int64_t step = std::max<int64_t>(1, static_cast<int64_t>(tile_ / (static_cast<uint64_t>(C) * ds)));
    uint8_t* cast = pvt::tile_scratch(2, static_cast<size_t>(std::min(step, rows) * C) * ds);
    for (int64_t r = 0; r < rows; r += step) {
      const int64_t k = std::min(step, rows - r);
      CKPT_RETURN_IF_ERROR(tracked_cast(src + static_cast<size_t>(r * C) * ss, sd, cast, dd, static_cast<size_t>(k * C), cast_, e));
      transpose_tile(cast, k, C, dst + static_cast<size_t>(r) * ds, ld, ds);
    }
    return Status::Ok();
  }

  // Canonical box `csub` [R, C] into dst [C, R]: canonical row tiles (contiguous reads when the
  // box spans its piece's columns), cast, transposed into their columns of dst.
  Status read_transposed(size_t sp, DType sd, DType dd, const Box& csub, uint8_t* dst, ExactnessEntry& e) {
    const size_t ss = dtype_size(sd);
    const int64_t R = csub.extent[0], C = csub.extent[1];
    if (R == 0 || C == 0) return Status::Ok();
    const int64_t step = std::max<int64_t>(1, static_cast<int64_t>(tile_ / (static_cast<uint64_t>(C) * ss)));
    uint8_t* raw = pvt::tile_scratch(1, static_cast<size_t>(std::min(step, R) * C) * ss);
    for (int64_t r = 0; r < R; r += step) {
      Box t = csub;
      t.offset[0] += r;
      t.extent[0] = std::min(step, R - r);
      CKPT_RETURN_IF_ERROR(src_->read(sp, t, raw));
      CKPT_RETURN_IF_ERROR(cast_transpose(raw, sd, dd, t.extent[0], C, dst + static_cast<size_t>(r) * dtype_size(dd), R, e));
    }
    return Status::Ok();
  }

  Status build() {
    std::map<std::string, size_t> canon_of;
    for (size_t i = 0; i < src_->tensors().size(); ++i) canon_of[src_->tensors()[i].name] = i;
    // Canonical tensor -> the (profile tensor, segment, first row) holding it.
    struct Slot {
      size_t pt, seg;
      int64_t row0;
    };
    std::map<std::string, std::vector<Slot>> slots;
    for (size_t k = 0; k < pts_.size(); ++k) {
      const ProfileTensor& pt = pts_[k];
      tensors_.push_back({pt.name, pt.dtype, pt.shape});
      int64_t row0 = 0;
      for (size_t s = 0; s < pt.segments.size(); ++s) {
        const ProfileSegment& seg = pt.segments[s];
        if (seg.canonical.empty()) {
          Box z = Box::whole(pvt::concat_shape(pt));
          z.offset[0] = row0;
          z.extent[0] = seg.zero_rows;
          pieces_.push_back({pt.name, Region{pvt::concat_to_stored(pt, z)}, pt.dtype});
          map_.push_back({0, k, s, row0, false, true, std::nullopt});
        } else {
          if (!canon_of.count(seg.canonical))
            return Status::Error("ProfileTensorMismatch", "'" + src_->describe() + "' has no tensor '" + seg.canonical +
                                                              "' for profile tensor '" + pt.name + "'");
          slots[seg.canonical].push_back({k, s, row0});
        }
        row0 += seg.rows();
      }
    }
    for (size_t i = 0; i < src_->pieces().size(); ++i) {
      const Piece& p = src_->pieces()[i];
      auto it = slots.find(p.tensor);
      if (it == slots.end()) continue;  // a canonical tensor the profile does not store
      const Shape& cshape = src_->tensors()[canon_of.at(p.tensor)].shape;
      if (it->second.size() == 1 && pvt::is_identity(pts_[it->second[0].pt], cshape)) {
        pieces_.push_back({pts_[it->second[0].pt].name, p.region, pts_[it->second[0].pt].dtype});
        map_.push_back({i, it->second[0].pt, 0, 0, true, false, std::nullopt});
        continue;
      }
      for (const Box& b : p.region.boxes())
        for (const Slot& sl : it->second) {
          const ProfileTensor& pt = pts_[sl.pt];
          auto x = intersect(b, pt.segments[sl.seg].box);
          if (!x) continue;
          const Box cb = pvt::canonical_to_concat(pt.segments[sl.seg], sl.row0, *x);
          pieces_.push_back({pt.name, Region{pvt::concat_to_stored(pt, cb)}, pt.dtype});
          map_.push_back({i, sl.pt, sl.seg, sl.row0, false, false, std::nullopt});
        }
    }
    for (Map& m : map_) m.rows = mapped_rows(m);  // here, on the constructing thread: file_extent may open files
    return Status::Ok();
  }

  TensorSource* src_ = nullptr;
  StagedReads* src_staged_ = nullptr;  // src_'s staged reads, when it has them
  std::unique_ptr<TensorSource> owner_;
  std::vector<ProfileTensor> pts_;
  std::vector<TensorMeta> tensors_;
  std::vector<Piece> pieces_;
  std::vector<Map> map_;
  nlohmann::json meta_;
  CastOptions cast_;
  uint64_t tile_ = kProfileTileBytes;
  ExactnessTracker tracker_;
  bool stop_on_overflow_ = false;

  // Without --saturate the job stops at the first read that overflows (nothing is committed).
  Status overflow_stop(const ExactnessEntry& e) const {
    uint64_t so_far = 0;
    for (const ExactnessEntry& x : tracker_.snapshot().entries()) so_far += x.clamped;
    return Status::Error("CastOverflow", e.step + ": " + std::to_string(e.clamped) + " of " + std::to_string(e.elements) +
                                             " elements of this read beyond the target's max finite (" +
                                             std::to_string(so_far) + " so far; the conversion stops at the first "
                                             "chunk that overflows and writes nothing; --saturate clamps them to the "
                                             "max finite and reports the counts)");
  }
};

}  // namespace

Result<std::unique_ptr<ProfileView>> make_profile_view(TensorSource& canon, std::unique_ptr<TensorSource> owner,
                                                       const std::vector<ProfileTensor>& pts, nlohmann::json metadata,
                                                       const CastOptions& cast, uint64_t tile_bytes) {
  return ProfileViewImpl::make(canon, std::move(owner), pts, std::move(metadata), cast, tile_bytes);
}

}  // namespace ckpt
