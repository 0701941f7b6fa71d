// The element kernels of the quantized formats (docs/QUANTIZATION.md), row-major blocks in memory:
//  - dequantization: fp8 x scale in f32, rounded once into the output dtype (DeepSeek's weight_dequant,
//    transformers' _dequantize_one), MXFP4 e2m1 x 2^(e - 127);
//  - quantization to block FP8 with transformers' FineGrainedFP8 rounding (Fp8Quantize._quantize_one):
//    per block amax (f32), scale = 448 / amax as torch computes a Python float over a tensor
//    (reciprocal(amax) * 448, two f32 roundings), inverse scale 1 / scale (f32, the stored
//    weight_scale_inv; 1 for an all-zero block), payload = fp8_e4m3fn(clamp(x * scale, -448, 448))
//    rounded to nearest even.
// Pure functions; thread safe.
#pragma once

#include <cstddef>
#include <cstdint>

#include "formats/base/status.h"
#include "formats/dtype/dtype.h"

namespace ckpt::quant {

// What rounding the f32 products into the output dtype changed (the exactness report of a
// dequantized export): elements, changed, the largest absolute and relative change.
struct RoundStats {
  uint64_t elements = 0, changed = 0;
  double max_abs = 0, max_rel = 0;
};

// Decoded F8_E4M3 / F8_E5M2 values, exact in f32 (NaN as NaN).
const float* fp8_table(DType t);

// out[r][c] = out_dtype(fp8[r][c] * scale[r / bm - row0_block][c / bn - col0_block]) for a box of
// `rows` x `cols` elements whose first element is (r0, c0) of the tensor: `scales` holds the
// [srows, scols] block scales (f32) covering the box, starting at block (r0 / bm, c0 / bn).
// `out_dtype` BF16 or F32 directly, others through cast_elements of an f32 row (errors: its).
Status dequant_fp8_box(const uint8_t* fp8, DType payload, int64_t rows, int64_t cols, int64_t r0, int64_t c0, int64_t bm,
                       int64_t bn, const float* scales, int64_t scols, DType out_dtype, void* out, RoundStats* stats = nullptr);

// MXFP4: `pairs` bytes of packed e2m1 (low nibble first) times 2^(exps[k / 16] - 127) into
// 2 * pairs values of `out_dtype` (BF16 or F32; others through cast_elements). The first byte is
// the first of its 16-byte block.
Status dequant_mxfp4(const uint8_t* packed, const uint8_t* exps, size_t pairs, DType out_dtype, void* out, RoundStats* stats = nullptr);

// Block-FP8 quantization of one block of `rows` x `cols` f32 values (row stride `stride`),
// transformers' rounding (above). Writes fp8 bytes (same stride) and returns the stored inverse
// scale. NaN / Inf inputs: error QuantNotFinite.
Result<float> quantize_fp8_block(const float* x, int64_t rows, int64_t cols, int64_t stride, uint8_t* fp8);

// MXFP4 quantization of one block of 32 f32 values into 16 bytes (low nibble first), gpt-oss's
// rounding: triton_kernels' downcast_to_mxfp (_compute_quant_and_scale, DequantScaleRoundingMode
// ROUND_UP, the default): scale = 2^ceil(log2(amax / 6)) by adding 0x7FFFFF to the f32 bits of
// amax / 6 and keeping the exponent; q = x * (1 / scale); E2M1 by its bit recipe (2 bits kept,
// rounded half up in magnitude, saturated at 6). Returns the scale's exponent byte (E8M0).
// NaN / Inf inputs: QuantNotFinite.
Result<uint8_t> quantize_mxfp4_block(const float* x, uint8_t* packed);

}  // namespace ckpt::quant
