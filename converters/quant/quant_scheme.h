// Which tensors of a checkpoint are quantized, and how (docs/QUANTIZATION.md). A quantized weight
// is one logical tensor made of a payload and its scales:
//  - fp8-block (DeepSeek-V3, Qwen3-FP8; transformers' FineGrainedFP8): `X.weight` F8_E4M3 [.., R, C]
//    and `X.weight_scale_inv` [.., ceil(R/bm), ceil(C/bn)] (F32, BF16 or F8_E8M0), block bm x bn
//    from quantization_config.weight_block_size (default 128 x 128); value = fp8 * scale_inv of its
//    block (the last blocks of a ragged shape are partial: DeepSeek's weight_dequant).
//  - fp8-tensor (per-tensor or per-channel, NVIDIA ModelOpt / compressed-tensors / fbgemm):
//    `X.weight` F8_E4M3 [R, C] and `X.weight_scale` [] / [1] (one scale) or [R] / [R, 1] (one per
//    row); value = fp8 * weight_scale. `X.input_scale` (activations) belongs to the weight: kept
//    with it, left out of a dequantized export.
//  - mxfp4 (gpt-oss): `X_blocks` U8 (or F4) [.., G, 16] (32 E2M1 values per row of 16 bytes, the
//    first in the low nibble) and `X_scales` U8 / F8_E8M0 [.., G]; value = e2m1 * 2^(scale - 127);
//    the logical tensor `X` is [.., G * 32], or its transpose for gpt-oss's experts (`transposed`).
// Found by tensor names and dtypes, and checked against the model config's quantization_config
// (metadata "model_config"). Errors, one per rule: QuantScaleMissing (a payload of a quantized
// checkpoint without its scales), QuantPayloadMissing (scales without their payload), QuantScaleShape,
// QuantScaleDType, QuantPayloadDType, QuantBlockSize (a bad weight_block_size). Pure; thread safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/base/status.h"
#include "formats/tensor/tensor_io.h"

namespace ckpt {

enum class QuantKind : uint8_t { kFp8Block, kFp8Tensor, kMxfp4 };
const char* quant_kind_name(QuantKind k);  // "fp8-block", "fp8-tensor", "mxfp4"

struct QuantTensor {
  QuantKind kind = QuantKind::kFp8Block;
  std::string name;         // the logical tensor (X.weight; for mxfp4 X)
  std::string payload;      // stored payload (X.weight, X_blocks)
  std::string scale;        // stored scales (X.weight_scale_inv, X.weight_scale, X_scales)
  std::string input_scale;  // fp8-tensor: X.input_scale when present
  Shape shape;              // the logical tensor's shape (values)
  Shape scale_shape;        // as stored
  DType payload_dtype = DType::kF8E4M3, scale_dtype = DType::kF32;
  int64_t block_rows = 1, block_cols = 1;  // fp8-block: bm x bn; fp8-tensor: R x C (or 1 x C per row); mxfp4: 1 x 32
  bool per_row = false;     // fp8-tensor: one scale per row
  // mxfp4 experts of gpt-oss (model_type gpt_oss): the files hold [.., out, in] (X_blocks [E, out,
  // in / 32, 16]), the model's parameter is [.., in, out] (gate_up_proj [E, h, 2F]); the logical
  // tensor `shape` is the model's, the stored blocks its transpose.
  bool transposed = false;
};

struct QuantScheme {
  std::vector<QuantTensor> tensors;    // sorted by name
  nlohmann::json config;               // quantization_config as read (null when none)
  bool any() const { return !tensors.empty(); }
  // "fp8-block 128x128", "fp8-tensor", "mxfp4 1x32", "fp8-block 128x128 + mxfp4 1x32".
  std::string describe() const;
  // Bytes of the payloads and scales as stored, and of the logical tensors in `dt`.
  uint64_t stored_bytes() const;
  uint64_t logical_bytes(DType dt) const;
  const QuantTensor* find(const std::string& logical_name) const;
  // Every stored name that belongs to a quantized tensor (payloads, scales, input scales).
  std::vector<std::string> stored_names() const;
  // For inspect: {scheme, block_sizes: ["128x128", ...], tensors, stored_bytes (payloads + scales),
  // bf16_bytes (the same tensors dequantized to bf16), saved_bytes, saved_fraction, quant_method}.
  nlohmann::json summary() const;
};

// The quantized tensors among `tensors` (a source's listing) with `metadata` (its model config).
// A checkpoint without any: an empty scheme.
Result<QuantScheme> find_quantized(const std::vector<TensorMeta>& tensors, const nlohmann::json& metadata);

// The quantization_config of a metadata's model config (null when none).
nlohmann::json quantization_config_of(const nlohmann::json& metadata);

}  // namespace ckpt
