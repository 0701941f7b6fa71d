// The dequantized view of a checkpoint (docs/QUANTIZATION.md): a TensorSource that presents each
// quantized weight of `inner` (quant_scheme.h) as its logical tensor in `out_dtype` (BF16 by
// default, as DeepSeek's fp8_cast_bf16 writes; F32 / F16 on request), computed per read box from
// the payload box and the scales of the blocks it touches, so a streaming export holds no more
// than its chunks. The scale tensors and fp8-tensor input scales are not tensors of the view; every
// other tensor and piece passes through unchanged (file extents too, so copies stay file to file).
// The model config in the metadata loses its quantization_config (the view is not quantized).
// Scales that are NaN or Inf: QuantScaleNotFinite at the read that meets them (the tensor, the block).
// Thread safety: read() may be called from several threads when inner's read may.
#pragma once

#include <memory>

#include "converters/quant/quant_scheme.h"
#include "formats/tensor/tensor_io.h"

namespace ckpt {

class ExactnessTracker;

// `inner` must outlive the view unless it is `owner` (which may be null). With `tracker`, each read
// of a quantized tensor adds an entry (step "dequantize <scheme> -> <dtype>"): the elements whose
// f32 value fp8 x scale the output dtype rounded (none for F32). `tracker` must outlive the view.
Result<std::unique_ptr<TensorSource>> dequant_view(TensorSource& inner, std::unique_ptr<TensorSource> owner, const QuantScheme& scheme,
                                                   DType out_dtype = DType::kBF16, ExactnessTracker* tracker = nullptr);

}  // namespace ckpt
