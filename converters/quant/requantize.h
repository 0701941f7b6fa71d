// Resharding a block-quantized checkpoint across block boundaries (`ckpt reshard --requantize`,
// docs/QUANTIZATION.md): when the target layout's TP boxes cut blocks, every quantized weight is
// dequantized (f32, as stored blocks say) and quantized again (transformers' rounding,
// quant_kernels.h) with the largest block (bm', bn') dividing the block size and every split
// offset of every quantized weight, one block size for the whole checkpoint as its
// quantization_config says. The view's reads count, per tensor, the elements whose value changed
// (the exactness report). Thread safety: as the views (dequant_view.h, quantize_view.h).
#pragma once

#include <memory>

#include "converters/profile/exactness.h"
#include "converters/quant/quant_scheme.h"
#include "reshard/layout/sharding.h"

namespace ckpt {

struct Requantized {
  std::unique_ptr<ExactnessTracker> tracker;
  std::unique_ptr<TensorSource> view;  // SRC re-quantized (owns the dequantized view over SRC)
  QuantScheme scheme;                  // the view's
};

// Null when `layout` cuts no block of `scheme` (nothing to re-quantize). QuantUnsupported when a
// weight does not divide by the new block (a ragged shape) or a scheme is not fp8-block. `src`
// must outlive the result.
Result<std::unique_ptr<Requantized>> requantize_for_layout(TensorSource& src, const QuantScheme& scheme, const ShardingRules& model,
                                                           const Layout& layout);

}  // namespace ckpt
