#include "converters/quant/quant_scheme.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "formats/base/checked.h"

namespace ckpt {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
std::string strip(const std::string& s, const std::string& suffix) { return s.substr(0, s.size() - suffix.size()); }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

Status quant_error(const char* code, const std::string& tensor, const std::string& msg) {
  return Status::Error(code, "quantized tensor '" + tensor + "': " + msg).with_tensor(tensor);
}

bool scale_dtype_ok(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF8E8M0; }

// The weight_block_size of a quantization_config: [bm, bn], default 128 x 128.
Result<std::pair<int64_t, int64_t>> block_size_of(const nlohmann::json& qc) {
  if (!qc.is_object() || !qc.contains("weight_block_size") || qc["weight_block_size"].is_null())
    return std::make_pair(int64_t{128}, int64_t{128});
  const auto& b = qc["weight_block_size"];
  if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || !b[1].is_number_integer() || b[0].get<int64_t>() < 1 ||
      b[1].get<int64_t>() < 1 || b[0].get<int64_t>() > (1 << 20) || b[1].get<int64_t>() > (1 << 20))
    return Status::Error("QuantBlockSize", "quantization_config.weight_block_size " + b.dump(-1).substr(0, 80) +
                                               ": expected [rows, cols], two integers in 1..1048576");
  return std::make_pair(b[0].get<int64_t>(), b[1].get<int64_t>());
}

Status fp8_block(QuantTensor& q, const TensorMeta& w, const TensorMeta& s, std::pair<int64_t, int64_t> bs) {
  if (w.shape.size() < 2)
    return quant_error("QuantScaleShape", w.name, "a block-scaled weight needs 2 or more dimensions, got " + shape_to_string(w.shape));
  q.block_rows = bs.first;
  q.block_cols = bs.second;
  Shape want = w.shape;
  want[want.size() - 2] = ceil_div(want[want.size() - 2], bs.first);
  want.back() = ceil_div(want.back(), bs.second);
  if (s.shape != want)
    return quant_error("QuantScaleShape", w.name, "scales '" + s.name + "' have shape " + shape_to_string(s.shape) + ", blocks of " +
                                                      std::to_string(bs.first) + "x" + std::to_string(bs.second) + " over " +
                                                      shape_to_string(w.shape) + " need " + shape_to_string(want));
  return Status::Ok();
}

Status fp8_tensor(QuantTensor& q, const TensorMeta& w, const TensorMeta& s) {
  const int64_t n = checked_numel(s.shape).value_or(-1);
  q.block_rows = w.shape.size() >= 2 ? w.shape[w.shape.size() - 2] : 1;
  q.block_cols = w.shape.empty() ? 1 : w.shape.back();
  if (n == 1) return Status::Ok();
  const bool rows_ok = w.shape.size() == 2 && (s.shape == Shape{w.shape[0]} || s.shape == Shape{w.shape[0], 1});
  if (!rows_ok)
    return quant_error("QuantScaleShape", w.name, "scale '" + s.name + "' has shape " + shape_to_string(s.shape) + "; a weight of " +
                                                      shape_to_string(w.shape) + " takes one scale ([] or [1]) or one per row ([" +
                                                      (w.shape.empty() ? std::string("?") : std::to_string(w.shape[0])) + "] or [" +
                                                      (w.shape.empty() ? std::string("?") : std::to_string(w.shape[0])) + ", 1])");
  q.per_row = true;
  q.block_rows = 1;
  return Status::Ok();
}

Status mxfp4(QuantTensor& q, const TensorMeta& b, const TensorMeta& s) {
  if (b.shape.size() < 2) return quant_error("QuantScaleShape", b.name, "MXFP4 blocks need [.., G, 16], got " + shape_to_string(b.shape));
  if (b.shape.back() != 16)  // 16 bytes: U8, or F4 counting packed pairs
    return quant_error("QuantScaleShape", b.name, "MXFP4 blocks hold 16 bytes (32 values) per block, got shape " + shape_to_string(b.shape));
  Shape want(b.shape.begin(), b.shape.end() - 1);
  if (s.shape != want)
    return quant_error("QuantScaleShape", b.name, "scales '" + s.name + "' have shape " + shape_to_string(s.shape) + ", blocks " +
                                                      shape_to_string(b.shape) + " need " + shape_to_string(want));
  q.shape = want;
  q.shape.back() *= 32;
  q.block_rows = 1;
  q.block_cols = 32;
  return Status::Ok();
}

}  // namespace

const char* quant_kind_name(QuantKind k) {
  switch (k) {
    case QuantKind::kFp8Block: return "fp8-block";
    case QuantKind::kFp8Tensor: return "fp8-tensor";
    case QuantKind::kMxfp4: return "mxfp4";
  }
  return "?";
}

nlohmann::json quantization_config_of(const nlohmann::json& metadata) {
  if (!metadata.is_object()) return nullptr;
  auto it = metadata.find("model_config");
  if (it == metadata.end() || !it->is_object()) return nullptr;
  auto q = it->find("quantization_config");
  return q == it->end() ? nlohmann::json(nullptr) : *q;
}

Result<QuantScheme> find_quantized(const std::vector<TensorMeta>& tensors, const nlohmann::json& metadata) {
  QuantScheme sc;
  sc.config = quantization_config_of(metadata);
  std::map<std::string, const TensorMeta*> by;
  for (const auto& t : tensors) by[t.name] = &t;
  CKPT_ASSIGN_OR_RETURN(auto bs, block_size_of(sc.config));
  const bool gpt_oss = metadata.is_object() && metadata.contains("model_config") && metadata["model_config"].is_object() &&
                       metadata["model_config"].value("model_type", nlohmann::json()) == "gpt_oss";
  std::set<std::string> used;
  // A scale-like name without a quantized payload: an error only in a quantized checkpoint (a
  // quantization_config, or other weights with scales); elsewhere an ordinary tensor's name.
  Status pending = Status::Ok();
  for (const auto& t : tensors) {
    QuantTensor q;
    std::string payload;
    if (ends_with(t.name, "_scale_inv")) {
      q.kind = QuantKind::kFp8Block;
      payload = strip(t.name, "_scale_inv");
    } else if (ends_with(t.name, ".weight_scale")) {
      q.kind = QuantKind::kFp8Tensor;
      payload = strip(t.name, "_scale");
    } else if (ends_with(t.name, "_scales") && by.count(strip(t.name, "_scales") + "_blocks")) {
      q.kind = QuantKind::kMxfp4;
      payload = strip(t.name, "_scales") + "_blocks";
    } else {
      continue;
    }
    auto pit = by.find(payload);
    if (pit == by.end()) {
      if (pending.ok()) pending = quant_error("QuantPayloadMissing", t.name, "scales without their payload '" + payload + "'");
      continue;
    }
    const TensorMeta& w = *pit->second;
    q.payload = w.name;
    q.scale = t.name;
    q.scale_shape = t.shape;
    q.scale_dtype = t.dtype;
    q.payload_dtype = w.dtype;
    q.name = q.kind == QuantKind::kMxfp4 ? strip(w.name, "_blocks") : w.name;
    q.shape = w.shape;
    const bool mx = q.kind == QuantKind::kMxfp4;
    if (mx ? (w.dtype != DType::kU8 && w.dtype != DType::kF4) : (w.dtype != DType::kF8E4M3 && w.dtype != DType::kF8E5M2)) {
      if (pending.ok())
        pending = quant_error("QuantPayloadDType", w.name, std::string("payload is ") + std::string(dtype_name(w.dtype)) + ", " +
                                                               (mx ? "MXFP4 blocks are U8 or F4" : "FP8 weights are F8_E4M3 or F8_E5M2"));
      continue;
    }
    if (mx ? (t.dtype != DType::kU8 && t.dtype != DType::kF8E8M0) : !scale_dtype_ok(t.dtype))
      return quant_error("QuantScaleDType", w.name, "scales '" + t.name + "' are " + std::string(dtype_name(t.dtype)) + ", expected " +
                                                        (mx ? "U8 or F8_E8M0 exponents" : "F32, BF16 or F8_E8M0"));
    if (q.kind == QuantKind::kFp8Block) CKPT_RETURN_IF_ERROR(fp8_block(q, w, t, bs));
    else if (q.kind == QuantKind::kFp8Tensor) CKPT_RETURN_IF_ERROR(fp8_tensor(q, w, t));
    else CKPT_RETURN_IF_ERROR(mxfp4(q, w, t));
    if (q.kind == QuantKind::kFp8Tensor) {
      const std::string in = strip(w.name, "weight") + "input_scale";
      if (by.count(in)) q.input_scale = in;
    }
    if (mx && gpt_oss && q.shape.size() >= 2 && q.name.find(".mlp.experts.") != std::string::npos) {
      std::swap(q.shape[q.shape.size() - 1], q.shape[q.shape.size() - 2]);
      q.transposed = true;
    }
    used.insert(w.name);
    sc.tensors.push_back(std::move(q));
  }
  if (!pending.ok() && (sc.config.is_object() || !sc.tensors.empty())) return pending;
  // A quantized checkpoint's FP8 weights all carry scales: one without is QuantScaleMissing.
  const bool fp8_config = sc.config.is_object() && sc.config.value("quant_method", std::string()) == "fp8";
  if (fp8_config || !sc.tensors.empty()) {
    for (const auto& t : tensors)
      if ((t.dtype == DType::kF8E4M3 || t.dtype == DType::kF8E5M2) && !used.count(t.name))
        return quant_error("QuantScaleMissing", t.name, std::string(dtype_name(t.dtype)) + " weight " + shape_to_string(t.shape) +
                                                            " of a quantized checkpoint has no scales ('" + t.name + "_scale_inv' or '" +
                                                            t.name + "_scale')");
  }
  std::sort(sc.tensors.begin(), sc.tensors.end(), [](const QuantTensor& a, const QuantTensor& b) { return a.name < b.name; });
  return sc;
}

std::string QuantScheme::describe() const {
  std::map<std::string, int> kinds;
  for (const auto& q : tensors) {
    std::string k = quant_kind_name(q.kind);
    if (q.kind != QuantKind::kFp8Tensor) k += " " + std::to_string(q.block_rows) + "x" + std::to_string(q.block_cols);
    else k += q.per_row ? " per-row" : " per-tensor";
    kinds[k]++;
  }
  std::string s;
  for (const auto& [k, n] : kinds) s += (s.empty() ? "" : " + ") + k;
  return s;
}

uint64_t QuantScheme::stored_bytes() const {
  uint64_t b = 0;
  for (const auto& q : tensors) {
    const uint64_t values = static_cast<uint64_t>(checked_numel(q.shape).value_or(0));
    b += q.kind == QuantKind::kMxfp4 ? values / 2 : values;  // two E2M1 per byte, or one FP8 byte
    b += static_cast<uint64_t>(checked_numel(q.scale_shape).value_or(0)) * dtype_size(q.scale_dtype);
  }
  return b;
}

uint64_t QuantScheme::logical_bytes(DType dt) const {
  uint64_t b = 0;
  for (const auto& q : tensors) b += static_cast<uint64_t>(checked_numel(q.shape).value_or(0)) * dtype_size(dt);
  return b;
}

const QuantTensor* QuantScheme::find(const std::string& logical_name) const {
  for (const auto& q : tensors)
    if (q.name == logical_name) return &q;
  return nullptr;
}

nlohmann::json QuantScheme::summary() const {
  std::set<std::string> blocks;
  for (const auto& q : tensors) blocks.insert(q.kind == QuantKind::kFp8Tensor ? (q.per_row ? "per-row" : "per-tensor")
                                                                              : std::to_string(q.block_rows) + "x" + std::to_string(q.block_cols));
  const uint64_t stored = stored_bytes(), bf16 = logical_bytes(DType::kBF16);
  return {{"scheme", describe()},
          {"block_sizes", std::vector<std::string>(blocks.begin(), blocks.end())},
          {"tensors", tensors.size()},
          {"stored_bytes", stored},
          {"bf16_bytes", bf16},
          {"saved_bytes", bf16 > stored ? bf16 - stored : 0},
          {"saved_fraction", bf16 ? static_cast<double>(bf16 > stored ? bf16 - stored : 0) / static_cast<double>(bf16) : 0.0},
          {"quant_method", config.is_object() ? config.value("quant_method", std::string()) : std::string()}};
}

std::vector<std::string> QuantScheme::stored_names() const {
  std::vector<std::string> v;
  for (const auto& q : tensors) {
    v.push_back(q.payload);
    v.push_back(q.scale);
    if (!q.input_scale.empty()) v.push_back(q.input_scale);
  }
  return v;
}

}  // namespace ckpt
