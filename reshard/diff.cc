#include "reshard/diff.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "formats/base/checked.h"
#include "reshard/executor.h"

namespace ckpt {

namespace {

// Element `i` of a dense buffer of dtype `t` as a double (exact for every float type; 64-bit
// integers beyond 2^53 round, which only affects the reported magnitudes, not bitwise checks).
double element_as_double(const unsigned char* p, DType t, size_t i) {
  auto ld = [&](auto v) {
    std::memcpy(&v, p + i * sizeof(v), sizeof(v));
    return v;
  };
  switch (t) {
    case DType::kBool: return p[i] ? 1.0 : 0.0;
    case DType::kU8: return ld(uint8_t{});
    case DType::kI8: return ld(int8_t{});
    case DType::kI16: return ld(int16_t{});
    case DType::kU16: return ld(uint16_t{});
    case DType::kI32: return ld(int32_t{});
    case DType::kU32: return ld(uint32_t{});
    case DType::kI64: return static_cast<double>(ld(int64_t{}));
    case DType::kU64: return static_cast<double>(ld(uint64_t{}));
    case DType::kF16: return f16_to_f32(ld(uint16_t{}));
    case DType::kBF16: return bf16_to_f32(ld(uint16_t{}));
    case DType::kF32: return ld(float{});
    case DType::kF64: return ld(double{});
    case DType::kF8E4M3: return f8e4m3_to_f32(p[i]);
    case DType::kF8E5M2: return f8e5m2_to_f32(p[i]);
    case DType::kF8E8M0: return f8e8m0_to_f32(p[i]);
    case DType::kF4: return p[i];  // a packed pair: compared as its byte
  }
  return 0.0;
}

// Reads the flat range [begin, end) of tensor `m` into `dst` (dense, in `m.dtype`).
Status read_flat(const GlobalBoxReader& reader, const TensorMeta& m, int64_t begin, int64_t end, unsigned char* dst) {
  const Box whole = Box::whole(m.shape);
  const size_t es = dtype_size(m.dtype);
  for (const Box& b : flat_range_to_boxes(whole, begin, end)) {
    if (b.numel() == 0) continue;
    CKPT_RETURN_IF_ERROR(reader(m.name, b, m.dtype, dst));
    dst += static_cast<size_t>(b.numel()) * es;
  }
  return Status::Ok();
}

Status compare_values(const TensorMeta& ma, const GlobalBoxReader& ra, const TensorMeta& mb,
                      const GlobalBoxReader& rb, const DiffOptions& o, TensorDiff& d) {
  CKPT_ASSIGN_OR_RETURN(int64_t n, shape_numel(ma.shape));
  d.numel = n;
  const size_t ea = dtype_size(ma.dtype), eb = dtype_size(mb.dtype);
  const bool same_dtype = ma.dtype == mb.dtype;
  // Chunk: as many elements as the budget allows (native buffers on both sides), rounded down to
  // whole rows of the trailing dimensions when a row fits, so each chunk is few boxes.
  const int64_t per_elem = static_cast<int64_t>(ea + eb);
  int64_t chunk = std::max<int64_t>(1, o.max_memory / std::max<int64_t>(per_elem, 1));
  if (!ma.shape.empty() && ma.shape[0] > 0) {
    const int64_t row = n / ma.shape[0];
    if (row > 0 && row <= chunk) chunk = (chunk / row) * row;
  }
  chunk = std::min(chunk, std::max<int64_t>(n, 1));
  std::vector<unsigned char> ba(static_cast<size_t>(chunk) * ea), bb(static_cast<size_t>(chunk) * eb);
  bool any_not_close = false, any_bit_diff = false;
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t end = std::min(n, begin + chunk);
    const size_t cnt = static_cast<size_t>(end - begin);
    Status s = read_flat(ra, ma, begin, end, ba.data());
    if (!s.ok()) return std::move(s).with_tensor(ma.name).with_context("reading A");
    s = read_flat(rb, mb, begin, end, bb.data());
    if (!s.ok()) return std::move(s).with_tensor(mb.name).with_context("reading B");
    if (same_dtype && std::memcmp(ba.data(), bb.data(), cnt * ea) == 0) continue;  // fast path
    for (size_t i = 0; i < cnt; ++i) {
      const double x = element_as_double(ba.data(), ma.dtype, i);
      const double y = element_as_double(bb.data(), mb.dtype, i);
      const bool bit_equal = same_dtype ? std::memcmp(ba.data() + i * ea, bb.data() + i * eb, ea) == 0
                                        : (x == y || (std::isnan(x) && std::isnan(y)));
      if (bit_equal) continue;
      ++d.bitwise_differ;
      any_bit_diff = true;
      const bool fx = std::isfinite(x), fy = std::isfinite(y);
      if (!fx || !fy) {
        // Equal specials (NaN/NaN with other payload, +0/-0 handled below, Inf/Inf same sign).
        const bool same_special = (std::isnan(x) && std::isnan(y)) || (std::isinf(x) && x == y);
        if (!same_special) {
          ++d.nonfinite_differ;
          ++d.not_close;
          any_not_close = true;
        }
        continue;
      }
      const double ad = std::fabs(x - y);
      if (ad > d.max_abs) {
        d.max_abs = ad;
        d.max_abs_index = begin + static_cast<int64_t>(i);
      }
      if (y != 0) d.max_rel = std::max(d.max_rel, ad / std::fabs(y));
      if (!(ad <= o.atol + o.rtol * std::fabs(y))) {
        ++d.not_close;
        any_not_close = true;
      }
    }
  }
  if (!same_dtype && !o.ignore_dtype) d.kind = TensorDiffKind::kDtypeMismatch;
  else if (any_not_close) d.kind = TensorDiffKind::kDifferent;
  else if (any_bit_diff || !same_dtype) d.kind = TensorDiffKind::kClose;
  else d.kind = TensorDiffKind::kIdentical;
  return Status::Ok();
}

std::string fmt_double(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

}  // namespace

const char* tensor_diff_kind_name(TensorDiffKind k) {
  switch (k) {
    case TensorDiffKind::kIdentical: return "identical";
    case TensorDiffKind::kClose: return "close";
    case TensorDiffKind::kDifferent: return "different";
    case TensorDiffKind::kOnlyInA: return "only_in_a";
    case TensorDiffKind::kOnlyInB: return "only_in_b";
    case TensorDiffKind::kShapeMismatch: return "shape_mismatch";
    case TensorDiffKind::kDtypeMismatch: return "dtype_mismatch";
  }
  return "?";
}

bool DiffReport::equal() const {
  for (const auto& t : tensors)
    if (t.kind != TensorDiffKind::kIdentical && t.kind != TensorDiffKind::kClose) return false;
  return true;
}

nlohmann::json DiffReport::to_json() const {
  nlohmann::json j;
  j["equal"] = equal();
  j["atol"] = options.atol;
  j["rtol"] = options.rtol;
  std::map<std::string, int64_t> counts;
  for (int k = 0; k <= static_cast<int>(TensorDiffKind::kDtypeMismatch); ++k)
    counts[tensor_diff_kind_name(static_cast<TensorDiffKind>(k))] = 0;
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& t : tensors) {
    ++counts[tensor_diff_kind_name(t.kind)];
    nlohmann::json e;
    e["name"] = t.name;
    e["status"] = tensor_diff_kind_name(t.kind);
    if (t.kind != TensorDiffKind::kOnlyInB) {
      e["dtype_a"] = std::string(dtype_name(t.dtype_a));
      e["shape_a"] = t.shape_a;
    }
    if (t.kind != TensorDiffKind::kOnlyInA) {
      e["dtype_b"] = std::string(dtype_name(t.dtype_b));
      e["shape_b"] = t.shape_b;
    }
    if (t.kind != TensorDiffKind::kOnlyInA && t.kind != TensorDiffKind::kOnlyInB &&
        t.kind != TensorDiffKind::kShapeMismatch) {
      e["numel"] = t.numel;
      e["bitwise_differ"] = t.bitwise_differ;
      e["not_close"] = t.not_close;
      e["nonfinite_differ"] = t.nonfinite_differ;
      e["max_abs"] = t.max_abs;
      e["max_rel"] = t.max_rel;
      e["max_abs_index"] = t.max_abs_index;
    }
    arr.push_back(std::move(e));
  }
  j["counts"] = counts;
  j["tensors"] = std::move(arr);
  return j;
}

std::string DiffReport::to_text() const {
  std::string s;
  std::map<std::string, int64_t> counts;
  for (const auto& t : tensors) {
    ++counts[tensor_diff_kind_name(t.kind)];
    if (t.kind == TensorDiffKind::kIdentical) continue;
    s += std::string(tensor_diff_kind_name(t.kind)) + "  " + t.name;
    switch (t.kind) {
      case TensorDiffKind::kOnlyInA: s += "  (only in A: " + std::string(dtype_name(t.dtype_a)) + " " + shape_to_string(t.shape_a) + ")"; break;
      case TensorDiffKind::kOnlyInB: s += "  (only in B: " + std::string(dtype_name(t.dtype_b)) + " " + shape_to_string(t.shape_b) + ")"; break;
      case TensorDiffKind::kShapeMismatch: s += "  shape A " + shape_to_string(t.shape_a) + " vs B " + shape_to_string(t.shape_b); break;
      default:
        if (t.dtype_a != t.dtype_b)
          s += "  dtype A " + std::string(dtype_name(t.dtype_a)) + " vs B " + std::string(dtype_name(t.dtype_b));
        s += "  max_abs " + fmt_double(t.max_abs) + "  max_rel " + fmt_double(t.max_rel) + "  not_close " +
             std::to_string(t.not_close) + "/" + std::to_string(t.numel);
        if (t.nonfinite_differ) s += "  nonfinite_differ " + std::to_string(t.nonfinite_differ);
    }
    s += "\n";
  }
  s += std::to_string(tensors.size()) + " tensors:";
  for (const auto& [k, v] : counts) s += " " + std::to_string(v) + " " + k + ",";
  if (s.back() == ',') s.pop_back();
  s += equal() ? "\nequal" : "\ndifferent";
  if (options.atol != 0 || options.rtol != 0) s += " (atol " + fmt_double(options.atol) + ", rtol " + fmt_double(options.rtol) + ")";
  s += "\n";
  return s;
}

Result<DiffReport> diff_tensors(const std::vector<TensorMeta>& a, const GlobalBoxReader& read_a,
                                const std::vector<TensorMeta>& b, const GlobalBoxReader& read_b,
                                const DiffOptions& options) {
  if (!(options.atol >= 0) || !(options.rtol >= 0))
    return Status::InvalidArgument("atol and rtol must be >= 0, got atol " + fmt_double(options.atol) + " rtol " +
                                   fmt_double(options.rtol));
  if (options.max_memory < 1024)
    return Status::InvalidArgument("max memory must be at least 1 KiB, got " + std::to_string(options.max_memory));
  std::map<std::string, const TensorMeta*> ma, mb;
  for (const auto& t : a)
    if (!ma.emplace(t.name, &t).second) return Status::Error("DuplicateTensor", "tensor '" + t.name + "' listed twice in A").with_tensor(t.name);
  for (const auto& t : b)
    if (!mb.emplace(t.name, &t).second) return Status::Error("DuplicateTensor", "tensor '" + t.name + "' listed twice in B").with_tensor(t.name);
  DiffReport rep;
  rep.options = options;
  std::map<std::string, int> names;
  for (const auto& [n, _] : ma) names[n] |= 1;
  for (const auto& [n, _] : mb) names[n] |= 2;
  for (const auto& [n, which] : names) {
    TensorDiff d;
    d.name = n;
    if (which & 1) { d.dtype_a = ma[n]->dtype; d.shape_a = ma[n]->shape; }
    if (which & 2) { d.dtype_b = mb[n]->dtype; d.shape_b = mb[n]->shape; }
    if (which == 1) d.kind = TensorDiffKind::kOnlyInA;
    else if (which == 2) d.kind = TensorDiffKind::kOnlyInB;
    else if (d.shape_a != d.shape_b) d.kind = TensorDiffKind::kShapeMismatch;
    else CKPT_RETURN_IF_ERROR(compare_values(*ma[n], read_a, *mb[n], read_b, options, d));
    rep.tensors.push_back(std::move(d));
  }
  return rep;
}

Result<DiffReport> diff_sources(TensorSource& a, TensorSource& b, const DiffOptions& options) {
  CKPT_ASSIGN_OR_RETURN(SourceIndex ia, SourceIndex::build(a));
  CKPT_ASSIGN_OR_RETURN(SourceIndex ib, SourceIndex::build(b));
  GlobalBoxReader ra = [&](const std::string& name, const Box& box, DType out, void* dst) {
    Status s = read_global_box(a, ia, name, box, out, dst);
    if (!s.ok()) return std::move(s).with_file(a.describe());
    return s;
  };
  GlobalBoxReader rb = [&](const std::string& name, const Box& box, DType out, void* dst) {
    Status s = read_global_box(b, ib, name, box, out, dst);
    if (!s.ok()) return std::move(s).with_file(b.describe());
    return s;
  };
  return diff_tensors(a.tensors(), ra, b.tensors(), rb, options);
}

}  // namespace ckpt
