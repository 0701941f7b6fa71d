#include "converters/quant/dequant_view.h"

#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <vector>

#include "converters/profile/exactness.h"
#include "converters/quant/quant_kernels.h"
#include "formats/base/checked.h"
#include "reshard/executor.h"
#include "reshard/source_index.h"

namespace ckpt {

namespace {

class DequantView : public TensorSource {
 public:
  DequantView(TensorSource& inner, std::unique_ptr<TensorSource> owner, QuantScheme scheme, DType out, SourceIndex index,
              ExactnessTracker* tracker)
      : inner_(inner), owner_(std::move(owner)), scheme_(std::move(scheme)), out_(out), index_(std::move(index)), tracker_(tracker) {
    std::set<std::string> hidden;
    for (const auto& q : scheme_.tensors) {
      hidden.insert(q.scale);
      if (!q.input_scale.empty()) hidden.insert(q.input_scale);
      by_payload_[q.payload] = &q;
    }
    for (const auto& t : inner_.tensors()) {
      if (hidden.count(t.name)) continue;
      auto it = by_payload_.find(t.name);
      if (it == by_payload_.end()) {
        tensors_.push_back(t);
        continue;
      }
      tensors_.push_back(TensorMeta{it->second->name, out_, it->second->shape});
    }
    for (size_t i = 0; i < inner_.pieces().size(); ++i) {
      const Piece& p = inner_.pieces()[i];
      if (hidden.count(p.tensor) || by_payload_.count(p.tensor)) continue;
      pieces_.push_back(p);
      map_.push_back(i);
    }
    for (const auto& q : scheme_.tensors) {
      pieces_.push_back(Piece{q.name, Region{Box::whole(q.shape)}, out_});
      map_.push_back(SIZE_MAX);
      quant_piece_.push_back(&q);
    }
    meta_ = inner_.metadata();
    if (meta_.is_object() && meta_.contains("model_config") && meta_["model_config"].is_object()) {
      meta_["model_config"].erase("quantization_config");
      for (const char* k : {"dtype", "torch_dtype"})
        if (meta_["model_config"].contains(k) && (out_ == DType::kBF16 || out_ == DType::kF32 || out_ == DType::kF16))
          meta_["model_config"][k] = out_ == DType::kBF16 ? "bfloat16" : out_ == DType::kF32 ? "float32" : "float16";
    }
    if (meta_.is_object()) meta_["dequantized_from"] = scheme_.describe();
  }

  const std::vector<TensorMeta>& tensors() const override { return tensors_; }
  const std::vector<Piece>& pieces() const override { return pieces_; }
  const nlohmann::json& metadata() const override { return meta_; }
  std::string describe() const override { return inner_.describe(); }

  Status read(size_t piece, const Box& sub, void* dst) override {
    if (piece >= pieces_.size()) return Status::Internal("dequant view: piece index out of range");
    if (map_[piece] != SIZE_MAX) return inner_.read(map_[piece], sub, dst);
    const QuantTensor& q = *quant_piece_[piece - (pieces_.size() - quant_piece_.size())];
    quant::RoundStats rs;
    Status st = q.kind == QuantKind::kMxfp4 ? read_mxfp4(q, sub, dst, tracker_ ? &rs : nullptr) : read_fp8(q, sub, dst, tracker_ ? &rs : nullptr);
    if (st.ok() && tracker_) {
      const std::string kind = q.kind == QuantKind::kFp8Tensor ? "fp8-tensor"
                                                              : std::string(quant_kind_name(q.kind)) + " " + std::to_string(q.block_rows) + "x" +
                                                                    std::to_string(q.block_cols);
      tracker_->add(ExactnessEntry{q.name, "", "dequantize " + kind + " -> " + std::string(dtype_name(out_)), rs.elements, rs.changed, 0,
                                   rs.max_abs, rs.max_rel});
    }
    return st;
  }
  std::optional<FileExtent> file_extent(size_t piece, const Box& sub) override {
    if (piece >= pieces_.size() || map_[piece] == SIZE_MAX) return std::nullopt;
    return inner_.file_extent(map_[piece], sub);
  }
  IntegrityInfo integrity() const override { return inner_.integrity(); }
  CheckReport check(const CheckOptions& o) override { return check_of_inner(inner_, o, /*same_pieces=*/false); }
  Status check_piece(size_t piece) override {
    if (piece >= pieces_.size()) return Status::Internal("dequant view: piece index out of range");
    if (map_[piece] != SIZE_MAX) return inner_.check_piece(map_[piece]);
    const QuantTensor& q = *quant_piece_[piece - (pieces_.size() - quant_piece_.size())];
    for (size_t i = 0; i < inner_.pieces().size(); ++i)
      if (inner_.pieces()[i].tensor == q.payload || inner_.pieces()[i].tensor == q.scale) CKPT_RETURN_IF_ERROR(inner_.check_piece(i));
    return Status::Ok();
  }
  std::optional<RangeCheck> range_check(size_t piece) override {
    if (piece >= pieces_.size() || map_[piece] == SIZE_MAX) return std::nullopt;
    return inner_.range_check(map_[piece]);
  }
  PieceStorage piece_storage(size_t piece) override {
    if (piece >= pieces_.size() || map_[piece] == SIZE_MAX) return {};
    return inner_.piece_storage(map_[piece]);
  }
  void set_read_threads(int threads) override { inner_.set_read_threads(threads); }
  uint64_t read_memory(int threads) const override { return inner_.read_memory(threads); }

 private:
  // The scales of the blocks box `sub` touches, as f32, checked finite.
  Status read_scales(const QuantTensor& q, const Box& sbox, std::vector<float>& s) {
    s.resize(static_cast<size_t>(sbox.numel()));
    CKPT_RETURN_IF_ERROR(read_global_box(inner_, index_, q.scale, sbox, DType::kF32, s.data()));
    for (size_t i = 0; i < s.size(); ++i)
      if (!std::isfinite(s[i]))
        return Status::Error("QuantScaleNotFinite", "quantized tensor '" + q.name + "': scale " + std::to_string(s[i]) + " in '" + q.scale +
                                                        "' (element " + std::to_string(i) + " of box " + sbox.to_string() +
                                                        "): a dequantized value would be NaN or Inf")
            .with_tensor(q.name);
    return Status::Ok();
  }

  Status read_fp8(const QuantTensor& q, const Box& sub, void* dst, quant::RoundStats* rs) {
    const size_t nd = sub.offset.size();
    std::vector<uint8_t> payload(static_cast<size_t>(sub.numel()));  // [sub] fp8 bytes
    CKPT_RETURN_IF_ERROR(read_global_box(inner_, index_, q.payload, sub, q.payload_dtype, payload.data()));
    // Scale box: the blocks of the last two dims (per-tensor: the one scale; per-row: the rows).
    Box sbox;
    int64_t bm = q.block_rows, bn = q.block_cols;
    if (q.kind == QuantKind::kFp8Tensor) {
      sbox = Box::whole(q.scale_shape);
      if (q.per_row) {
        sbox.offset[0] = sub.offset[0];
        sbox.extent[0] = sub.extent[0];
        bm = 1;
      }
    } else {
      sbox = sub;
      sbox.offset[nd - 2] = sub.offset[nd - 2] / bm;
      sbox.extent[nd - 2] = (sub.offset[nd - 2] + sub.extent[nd - 2] - 1) / bm - sbox.offset[nd - 2] + 1;
      sbox.offset[nd - 1] = sub.offset[nd - 1] / bn;
      sbox.extent[nd - 1] = (sub.offset[nd - 1] + sub.extent[nd - 1] - 1) / bn - sbox.offset[nd - 1] + 1;
    }
    std::vector<float> s;
    if (sub.numel() == 0) return Status::Ok();
    CKPT_RETURN_IF_ERROR(read_scales(q, sbox, s));
    const int64_t rows = nd >= 2 ? sub.extent[nd - 2] : 1, cols = sub.extent[nd - 1];
    const int64_t r0 = nd >= 2 ? sub.offset[nd - 2] : 0, c0 = sub.offset[nd - 1];
    const bool one = q.kind == QuantKind::kFp8Tensor && !q.per_row;
    const int64_t scols = one ? 1 : (q.per_row ? 1 : sbox.extent[nd - 1]);
    const int64_t lead = rows * cols > 0 ? sub.numel() / (rows * cols) : 0;
    const int64_t smat = one ? 0 : static_cast<int64_t>(s.size()) / std::max<int64_t>(1, lead);
    auto* out = static_cast<uint8_t*>(dst);
    for (int64_t l = 0; l < lead; ++l) {  // leading dims (experts): one matrix each
      CKPT_RETURN_IF_ERROR(quant::dequant_fp8_box(payload.data() + l * rows * cols, q.payload_dtype, rows, cols, one ? 0 : r0,
                                                  one ? 0 : c0, one ? INT64_MAX / 2 : bm, one ? INT64_MAX / 2 : bn, s.data() + l * smat,
                                                  scols, out_, out + static_cast<size_t>(l * rows * cols) * dtype_size(out_), rs));
    }
    return Status::Ok();
  }

  // gpt-oss's experts (QuantTensor::transposed): the stored box is `sub` with its last two dims
  // swapped, dequantized, then transposed into `dst`.
  Status read_mxfp4(const QuantTensor& q, const Box& sub, void* dst, quant::RoundStats* rs) {
    if (!q.transposed) return read_mxfp4_stored(q, sub, dst, rs);
    const size_t nd = sub.offset.size(), es = dtype_size(out_);
    Box t = sub;
    std::swap(t.offset[nd - 1], t.offset[nd - 2]);
    std::swap(t.extent[nd - 1], t.extent[nd - 2]);
    if (sub.numel() == 0) return Status::Ok();
    std::vector<uint8_t> tmp(static_cast<size_t>(t.numel()) * es);  // [.., R, C] as stored
    CKPT_RETURN_IF_ERROR(read_mxfp4_stored(q, t, tmp.data(), rs));
    const int64_t R = t.extent[nd - 2], C = t.extent[nd - 1], lead = t.numel() / (R * C);
    auto* out = static_cast<uint8_t*>(dst);
    for (int64_t l = 0; l < lead; ++l)
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c)
          std::memcpy(out + static_cast<size_t>((l * C + c) * R + r) * es, tmp.data() + static_cast<size_t>((l * R + r) * C + c) * es, es);
    return Status::Ok();
  }

  Status read_mxfp4_stored(const QuantTensor& q, const Box& sub, void* dst, quant::RoundStats* rs) {
    // The 32-value blocks the box touches along its last dimension; a box that does not start and
    // end on block boundaries is dequantized whole blocks wide and cut out.
    const size_t nd = sub.offset.size();
    if (sub.numel() == 0) return Status::Ok();
    Box wide = sub;
    wide.offset[nd - 1] = sub.offset[nd - 1] / 32 * 32;
    wide.extent[nd - 1] = (sub.offset[nd - 1] + sub.extent[nd - 1] + 31) / 32 * 32 - wide.offset[nd - 1];
    Box bbox = wide, sbox = wide;
    bbox.offset[nd - 1] = sbox.offset[nd - 1] = wide.offset[nd - 1] / 32;
    bbox.extent[nd - 1] = sbox.extent[nd - 1] = wide.extent[nd - 1] / 32;
    bbox.offset.push_back(0);
    bbox.extent.push_back(16);
    std::vector<uint8_t> blocks(static_cast<size_t>(bbox.numel())), exps(static_cast<size_t>(sbox.numel()));
    CKPT_RETURN_IF_ERROR(read_global_box(inner_, index_, q.payload, bbox, q.payload_dtype, blocks.data()));
    CKPT_RETURN_IF_ERROR(read_global_box(inner_, index_, q.scale, sbox, q.scale_dtype, exps.data()));
    for (size_t i = 0; i < exps.size(); ++i)
      if (exps[i] == 0xFF)
        return Status::Error("QuantScaleNotFinite", "quantized tensor '" + q.name + "': scale " + std::to_string(i) + " of box " +
                                                        sbox.to_string() + " in '" + q.scale + "' is 0xFF (E8M0 NaN)").with_tensor(q.name);
    if (wide == sub) return quant::dequant_mxfp4(blocks.data(), exps.data(), blocks.size(), out_, dst, rs);
    std::vector<uint8_t> tmp(static_cast<size_t>(wide.numel()) * dtype_size(out_));  // [wide] dequantized
    CKPT_RETURN_IF_ERROR(quant::dequant_mxfp4(blocks.data(), exps.data(), blocks.size(), out_, tmp.data(), rs));
    copy_box(tmp.data(), wide, dst, sub, sub, dtype_size(out_));
    return Status::Ok();
  }

  TensorSource& inner_;
  std::unique_ptr<TensorSource> owner_;
  QuantScheme scheme_;
  DType out_;
  SourceIndex index_;
  std::vector<TensorMeta> tensors_;
  std::vector<Piece> pieces_;
  std::vector<size_t> map_;  // view piece -> inner piece (SIZE_MAX: a quantized tensor's)
  std::vector<const QuantTensor*> quant_piece_;  // the quantized pieces, at the end of pieces_
  std::map<std::string, const QuantTensor*> by_payload_;
  nlohmann::json meta_;
  ExactnessTracker* tracker_;
};

}  // namespace

Result<std::unique_ptr<TensorSource>> dequant_view(TensorSource& inner, std::unique_ptr<TensorSource> owner, const QuantScheme& scheme,
                                                   DType out_dtype, ExactnessTracker* tracker) {
  if (out_dtype != DType::kBF16 && out_dtype != DType::kF32 && out_dtype != DType::kF16)
    return Status::InvalidArgument("dequantized tensors are bf16, fp16 or fp32, not " + std::string(dtype_name(out_dtype)));
  CKPT_ASSIGN_OR_RETURN(SourceIndex index, SourceIndex::build(inner));
  return std::unique_ptr<TensorSource>(new DequantView(inner, std::move(owner), scheme, out_dtype, std::move(index), tracker));
}

}  // namespace ckpt
