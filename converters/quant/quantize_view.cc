#include "converters/quant/quantize_view.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <tuple>
#include <vector>

#include "converters/profile/exactness.h"
#include "converters/quant/quant_kernels.h"
#include "converters/quant/quant_scheme.h"
#include "reshard/executor.h"
#include "reshard/source_index.h"

namespace ckpt {

namespace {

// MXFP4 reads go in bands of this many values (or one row, when longer): 64 Ki values, 0.6 MiB.
constexpr int64_t kMxBandValues = int64_t{1} << 16;

class QuantizeView : public TensorSource {
 public:
  QuantizeView(TensorSource& inner, std::unique_ptr<TensorSource> owner, QuantizeRequest req, SourceIndex index)
      : inner_(inner), owner_(std::move(owner)), req_(req), index_(std::move(index)) {
    for (const auto& t : inner_.tensors()) by_name_[t.name] = &t;
    for (size_t i = 0; i < inner_.pieces().size(); ++i) {
      const Piece& p = inner_.pieces()[i];
      if (!quantized(p.tensor)) {
        pieces_.push_back(p);
        map_.push_back(i);
      }
    }
    for (const auto& t : inner_.tensors()) {
      if (!quantized(t.name)) {
        tensors_.push_back(t);
        continue;
      }
      Shape s = t.shape, p = t.shape;
      s[s.size() - 2] /= req_.block_rows;
      s.back() /= req_.block_cols;
      std::string payload = t.name, scale = t.name + "_scale_inv";
      DType pdt = DType::kF8E4M3, sdt = DType::kF32;
      if (mx()) {  // gpt-oss: X_blocks U8 [.., C / 32, 16], X_scales U8 [.., C / 32]
        p.back() /= 32;
        p.push_back(16);
        payload = t.name + "_blocks";
        scale = t.name + "_scales";
        pdt = sdt = DType::kU8;
      }
      tensors_.push_back(TensorMeta{payload, pdt, p});
      tensors_.push_back(TensorMeta{scale, sdt, s});
      for (const auto& [n, sh, dt] : {std::tuple{payload, p, pdt}, std::tuple{scale, s, sdt}}) {
        pieces_.push_back(Piece{n, Region{Box::whole(sh)}, dt});
        map_.push_back(SIZE_MAX);
        kind_.push_back({t.name, n == scale});
      }
      shape_[t.name] = t.shape;
    }
    meta_ = inner_.metadata();
    if (mx() && meta_.is_object() && meta_.contains("model_config") && meta_["model_config"].is_object())
      meta_["model_config"]["quantization_config"] = {{"quant_method", "mxfp4"}};
    else if (meta_.is_object() && meta_.contains("model_config") && meta_["model_config"].is_object())
      meta_["model_config"]["quantization_config"] = {{"quant_method", "fp8"},
                                                      {"weight_block_size", {req_.block_rows, req_.block_cols}},
                                                      {"fmt", "e4m3"},
                                                      {"activation_scheme", "dynamic"}};
  }

  bool mx() const { return req_.scheme == "mxfp4"; }

  // Whether `name` (a source tensor) is quantized by this view.
  bool quantized(const std::string& name) const {
    auto it = by_name_.find(name);
    if (!name.ends_with("_proj.weight") || it == by_name_.end()) return false;
    const TensorMeta& t = *it->second;
    return t.shape.size() >= 2 && dtype_is_float(t.dtype) && t.dtype != DType::kF4 && t.shape[t.shape.size() - 2] % req_.block_rows == 0 &&
           t.shape.back() % req_.block_cols == 0 && t.shape.back() > 0;
  }

  const std::vector<TensorMeta>& tensors() const override { return tensors_; }
  const std::vector<Piece>& pieces() const override { return pieces_; }
  const nlohmann::json& metadata() const override { return meta_; }
  std::string describe() const override { return inner_.describe(); }
  IntegrityInfo integrity() const override { return inner_.integrity(); }
  CheckReport check(const CheckOptions& o) override { return check_of_inner(inner_, o, false); }
  void set_read_threads(int threads) override { inner_.set_read_threads(threads); }
  std::optional<FileExtent> file_extent(size_t piece, const Box& sub) override {
    if (piece >= pieces_.size() || map_[piece] == SIZE_MAX) return std::nullopt;
    return inner_.file_extent(map_[piece], sub);
  }
  Status check_piece(size_t piece) override {
    if (piece < pieces_.size() && map_[piece] != SIZE_MAX) return inner_.check_piece(map_[piece]);
    return Status::Ok();
  }

  Status read(size_t piece, const Box& sub, void* dst) override {
    if (piece >= pieces_.size()) return Status::Internal("quantize view: piece index out of range");
    if (map_[piece] != SIZE_MAX) return inner_.read(map_[piece], sub, dst);
    const auto& [weight, is_scale] = kind_[piece - (pieces_.size() - kind_.size())];
    if (mx()) return read_mxfp4(weight, is_scale, sub, dst);
    if (sub.numel() == 0) return Status::Ok();
    // One band at a time: one index of the leading dims and one block row (a scale box: one scale
    // row), so a read holds one block row of its width in f32 whatever the chunk (read_memory).
    const size_t nd = sub.offset.size();
    const int64_t step = is_scale ? 1 : req_.block_rows, r0 = sub.offset[nd - 2], r1 = r0 + sub.extent[nd - 2];
    const int64_t lead = sub.numel() / (sub.extent[nd - 2] * sub.extent[nd - 1]);
    for (int64_t l = 0; l < lead; ++l) {
      Box band = sub;
      for (size_t d = nd - 2, rem = static_cast<size_t>(l); d-- > 0;) {
        band.offset[d] = sub.offset[d] + static_cast<int64_t>(rem % static_cast<size_t>(sub.extent[d]));
        band.extent[d] = 1;
        rem /= static_cast<size_t>(sub.extent[d]);
      }
      for (int64_t r = r0; r < r1; r = (r / step + 1) * step) {
        band.offset[nd - 2] = r;
        band.extent[nd - 2] = std::min(r1, (r / step + 1) * step) - r;
        CKPT_RETURN_IF_ERROR(read_band(weight, is_scale, band, sub, dst));
      }
    }
    return Status::Ok();
  }

  // Per concurrent read: a block row of the widest quantized weight (MXFP4: a band of kMxBandValues
  // values, or a row) in f32 (and as read, up to 4 bytes), and its FP8 / packed bytes.
  uint64_t read_memory(int threads) const override {
    int64_t widest = 0;
    for (const auto& [name, shape] : shape_) widest = std::max(widest, shape.back());
    const uint64_t band = mx() ? static_cast<uint64_t>(std::max(kMxBandValues, widest)) * (4 + 4 + 1)
                               : static_cast<uint64_t>(req_.block_rows) * static_cast<uint64_t>(widest) * (4 + 4 + 1);
    return inner_.read_memory(threads) + static_cast<uint64_t>(exec_pipeline_depth(threads)) * band;
  }

 private:
  // `band` of a payload (the weight box of the blocks it touches) or of a scale tensor (its blocks),
  // quantized into its place in `dst`, laid out as `sub`.
  Status read_band(const std::string& weight, bool is_scale, const Box& band, const Box& sub, void* dst) {
    const Shape& shape = shape_.at(weight);
    const size_t nd = shape.size();
    const int64_t bm = req_.block_rows, bn = req_.block_cols;
    Box wide = band;
    for (size_t k = 0; k < 2; ++k) {
      const size_t d = nd - 2 + k;
      const int64_t b = k == 0 ? bm : bn;
      const int64_t lo = is_scale ? band.offset[d] * b : band.offset[d] / b * b;
      const int64_t hi = is_scale ? (band.offset[d] + band.extent[d]) * b : (band.offset[d] + band.extent[d] + b - 1) / b * b;
      wide.offset[d] = lo;
      wide.extent[d] = hi - lo;
    }
    std::vector<float> x(static_cast<size_t>(wide.numel()));  // [wide] f32
    CKPT_RETURN_IF_ERROR(read_global_box(inner_, index_, weight, wide, DType::kF32, x.data()));
    std::vector<uint8_t> q(x.size());  // [wide] fp8
    const int64_t rows = wide.extent[nd - 2], cols = wide.extent[nd - 1];
    const int64_t lead = wide.numel() / (rows * cols), sr = rows / bm, sc = cols / bn;
    std::vector<float> inv(static_cast<size_t>(lead * sr * sc));  // [lead, sr, sc]
    for (int64_t l = 0; l < lead; ++l)
      for (int64_t i = 0; i < sr; ++i)
        for (int64_t j = 0; j < sc; ++j) {
          const size_t off = static_cast<size_t>(l * rows * cols + i * bm * cols + j * bn);
          auto s = quant::quantize_fp8_block(x.data() + off, bm, bn, cols, q.data() + off);
          if (!s.ok()) return Status::Error(s.status().code(), "tensor '" + weight + "': " + s.status().message()).with_tensor(weight);
          inv[static_cast<size_t>((l * sr + i) * sc + j)] = *s;
        }
    if (is_scale) {  // the band's scales are exactly the blocks read
      copy_box(inv.data(), band, dst, sub, band, sizeof(float));
      return Status::Ok();
    }
    if (req_.tracker) track(weight, x, q, inv, wide, band);
    copy_box(q.data(), wide, dst, sub, band, 1);
    return Status::Ok();
  }

  // MXFP4: a box of X_blocks [.., G, 16] (whole 16-byte rows read, cut out after) or of X_scales
  // [.., G]: the logical [.., G * 32] values of its blocks read in f32 and quantized.
  Status read_mxfp4(const std::string& weight, bool is_scale, const Box& sub, void* dst) {
    if (sub.numel() == 0) return Status::Ok();
    Box groups = sub;  // [.., G] box
    if (!is_scale) {
      groups.offset.pop_back();
      groups.extent.pop_back();
    }
    // In bands of rows (one leading index, kMxBandValues values or one row), as read() for FP8.
    const size_t nd = groups.offset.size();
    const int64_t G = groups.extent[nd - 1], r0 = groups.offset[nd - 2], r1 = r0 + groups.extent[nd - 2];
    const int64_t step = std::max<int64_t>(1, kMxBandValues / (G * 32)), lead = groups.numel() / (groups.extent[nd - 2] * G);
    for (int64_t l = 0; l < lead; ++l) {
      Box band = groups;
      for (size_t d = nd - 2, rem = static_cast<size_t>(l); d-- > 0;) {
        band.offset[d] = groups.offset[d] + static_cast<int64_t>(rem % static_cast<size_t>(groups.extent[d]));
        band.extent[d] = 1;
        rem /= static_cast<size_t>(groups.extent[d]);
      }
      for (int64_t r = r0; r < r1; r += step) {
        band.offset[nd - 2] = r;
        band.extent[nd - 2] = std::min(r1, r + step) - r;
        CKPT_RETURN_IF_ERROR(read_mxfp4_band(weight, is_scale, band, sub, dst));
      }
    }
    return Status::Ok();
  }

  // The groups `groups` (a band of `sub`'s) quantized into their place in `dst`, laid out as `sub`.
  Status read_mxfp4_band(const std::string& weight, bool is_scale, const Box& groups, const Box& sub, void* dst) {
    Box logical = groups;
    logical.offset.back() *= 32;
    logical.extent.back() *= 32;
    std::vector<float> x(static_cast<size_t>(logical.numel()));  // [logical] f32
    CKPT_RETURN_IF_ERROR(read_global_box(inner_, index_, weight, logical, DType::kF32, x.data()));
    const size_t nblk = x.size() / 32;
    std::vector<uint8_t> packed(nblk * 16), exps(nblk);  // [groups, 16], [groups]
    ExactnessEntry e{weight, "", req_.step};
    for (size_t b = 0; b < nblk; ++b) {
      auto s = quant::quantize_mxfp4_block(x.data() + b * 32, packed.data() + b * 16);
      if (!s.ok()) return Status::Error(s.status().code(), "tensor '" + weight + "': " + s.status().message()).with_tensor(weight);
      exps[b] = *s;
    }
    if (is_scale) {
      copy_box(exps.data(), groups, dst, sub, groups, 1);
      return Status::Ok();
    }
    if (req_.tracker) {  // what quantizing changed, for the groups whose bytes this read returns
      std::vector<float> back(32);
      for (size_t b = 0; b < nblk; ++b) {
        (void)quant::dequant_mxfp4(packed.data() + b * 16, &exps[b], 16, DType::kF32, back.data());
        for (int k = 0; k < 32; ++k) {
          ++e.elements;
          const float v = back[static_cast<size_t>(k)], xv = x[b * 32 + static_cast<size_t>(k)];
          if (v == xv) continue;
          ++e.changed;
          e.max_abs = std::max(e.max_abs, std::fabs(static_cast<double>(v) - xv));
          if (xv != 0) e.max_rel = std::max(e.max_rel, std::fabs(static_cast<double>(v) - xv) / std::fabs(static_cast<double>(xv)));
        }
      }
    }
    Box whole = groups, part = groups;  // the whole 16-byte rows of the groups, and sub's bytes of them
    whole.offset.push_back(0);
    whole.extent.push_back(16);
    part.offset.push_back(sub.offset.back());
    part.extent.push_back(sub.extent.back());
    copy_box(packed.data(), whole, dst, sub, part, 1);
    if (req_.tracker && sub.offset.back() == 0) req_.tracker->add(e);  // once per group (its first byte's read)
    return Status::Ok();
  }

  // The exactness of the elements of `sub` (inside `wide`, whose f32 values `x` were quantized to
  // `q` with inverse scales `inv` [lead, rows / bm, cols / bn]).
  void track(const std::string& weight, const std::vector<float>& x, const std::vector<uint8_t>& q, const std::vector<float>& inv,
             const Box& wide, const Box& sub) const {
    const size_t nd = wide.extent.size();
    const int64_t rows = wide.extent[nd - 2], cols = wide.extent[nd - 1], sc = cols / req_.block_cols;
    const float* lut = quant::fp8_table(DType::kF8E4M3);
    ExactnessEntry e{weight, "", req_.step};
    for (size_t i = 0; i < x.size(); ++i) {
      const int64_t l = static_cast<int64_t>(i) / (rows * cols), r = static_cast<int64_t>(i) / cols % rows, c = static_cast<int64_t>(i) % cols;
      bool in = true;  // inside `sub`?
      int64_t rem = static_cast<int64_t>(i);
      for (size_t d = nd; d-- > 0;) {
        const int64_t g = wide.offset[d] + rem % wide.extent[d];
        rem /= wide.extent[d];
        in = in && g >= sub.offset[d] && g < sub.offset[d] + sub.extent[d];
      }
      if (!in) continue;
      const float s = inv[static_cast<size_t>((l * (rows / req_.block_rows) + r / req_.block_rows) * sc + c / req_.block_cols)];
      const float v = lut[q[i]] * s;
      ++e.elements;
      if (v != x[i]) {
        ++e.changed;
        const double err = std::fabs(static_cast<double>(v) - x[i]);
        e.max_abs = std::max(e.max_abs, err);
        if (x[i] != 0) e.max_rel = std::max(e.max_rel, err / std::fabs(static_cast<double>(x[i])));
      }
    }
    req_.tracker->add(e);
  }

  TensorSource& inner_;
  std::unique_ptr<TensorSource> owner_;
  QuantizeRequest req_;
  SourceIndex index_;
  std::vector<TensorMeta> tensors_;
  std::vector<Piece> pieces_;
  std::vector<size_t> map_;
  std::vector<std::pair<std::string, bool>> kind_;  // quantized pieces (at the end): weight, is_scale
  std::map<std::string, Shape> shape_;
  std::map<std::string, const TensorMeta*> by_name_;  // inner's tensors
  nlohmann::json meta_;
};

}  // namespace

Result<QuantizeRequest> parse_quantize_flag(const std::string& text) {
  QuantizeRequest r;
  const auto bad = [&] {
    return Status::InvalidArgument("--quantize '" + text + "': expected fp8-block, fp8-block:RxC (e.g. fp8-block:128x128) or mxfp4");
  };
  if (text == "fp8-block") return r;
  if (text == "mxfp4") {  // gpt-oss's packing and rounding, blocks of 32 along the last dimension
    r.scheme = "mxfp4";
    r.block_rows = 1;
    r.block_cols = 32;
    return r;
  }
  if (text.rfind("fp8-block:", 0) != 0) return bad();
  const std::string rc = text.substr(10);
  const size_t x = rc.find('x');
  if (x == std::string::npos) return bad();
  try {
    size_t p1 = 0, p2 = 0;
    r.block_rows = std::stoll(rc.substr(0, x), &p1);
    r.block_cols = std::stoll(rc.substr(x + 1), &p2);
    if (p1 != x || p2 != rc.size() - x - 1) return bad();
  } catch (...) {
    return bad();
  }
  if (r.block_rows < 1 || r.block_cols < 1 || r.block_rows > 4096 || r.block_cols > 4096) return bad();
  return r;
}

Result<std::unique_ptr<TensorSource>> quantize_view(TensorSource& inner, std::unique_ptr<TensorSource> owner, const QuantizeRequest& req) {
  CKPT_ASSIGN_OR_RETURN(QuantScheme already, find_quantized(inner.tensors(), inner.metadata()));
  if (already.any())
    return Status::Error("QuantUnsupported", "'" + inner.describe() + "' is already quantized (" + already.describe() +
                                                 "); --quantize takes an unquantized checkpoint");
  CKPT_ASSIGN_OR_RETURN(SourceIndex index, SourceIndex::build(inner));
  return std::unique_ptr<TensorSource>(new QuantizeView(inner, std::move(owner), req, std::move(index)));
}

}  // namespace ckpt
