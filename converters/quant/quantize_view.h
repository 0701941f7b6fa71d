// Quantizing on export (docs/QUANTIZATION.md "Quantize"): a TensorSource that presents the linear
// weights of `inner` (LLaMA naming: every `*_proj.weight`, as transformers' FineGrainedFP8 replaces
// every nn.Linear but lm_head) whose last two dimensions divide by the block as block-scaled FP8:
// `X.weight` F8_E4M3 and `X.weight_scale_inv` F32 [R / bm, C / bn], quantized with transformers'
// Fp8Quantize rounding (quant_kernels.h). Weights that do not divide stay as they are, as
// transformers leaves them. A read goes one band at a time (one leading index, one block row; a
// scale box: one scale row), reading the band's whole blocks in f32 and quantizing them, so a read
// holds a block row of its weight whatever the chunk (read_memory() reports it). The model
// config in the metadata gains quantization_config {quant_method fp8, weight_block_size, fmt e4m3,
// activation_scheme dynamic}. NaN / Inf weights: QuantNotFinite naming the tensor.
// Thread safety: read() may be called from several threads when inner's read may.
#pragma once

#include <memory>
#include <string>

#include "formats/tensor/tensor_io.h"

namespace ckpt {

class ExactnessTracker;

struct QuantizeRequest {
  std::string scheme = "fp8-block";
  int64_t block_rows = 128, block_cols = 128;
  // When set, every payload read adds an entry per tensor (step `step`): the elements whose value
  // after quantization (fp8 x its new scale, f32) differs from the value read (resharding with
  // --requantize: the value dequantized with the old blocks). Must outlive the view.
  ExactnessTracker* tracker = nullptr;
  std::string step;
};

// "fp8-block", "fp8-block:RxC" (e.g. 128x128) or "mxfp4" (every `*_proj.weight` whose last dimension
// divides by 32 as gpt-oss's `X_blocks` U8 [.., C / 32, 16] + `X_scales` U8 [.., C / 32] with
// triton_kernels' downcast_to_mxfp rounding, quant_kernels.h; quantization_config {quant_method
// mxfp4}); anything else: InvalidArgument naming --quantize.
Result<QuantizeRequest> parse_quantize_flag(const std::string& text);

// `inner` must outlive the view unless it is `owner`. A source that is already quantized is
// refused (QuantUnsupported).
Result<std::unique_ptr<TensorSource>> quantize_view(TensorSource& inner, std::unique_ptr<TensorSource> owner, const QuantizeRequest& req);

}  // namespace ckpt
