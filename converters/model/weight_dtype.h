// The dtype rule of a model weight: a LLaMA weight is a float tensor. A weight stored in an
// integer dtype is refused by name, never passed through (issue 36: PaddleNLP stores bf16 as
// U16 bit patterns, marked only by its config's "dtype": "bfloat16"; transformers would read the
// bit patterns as numbers). Pure function; thread safe.
#pragma once

#include <string>

#include "formats/base/status.h"
#include "formats/tensor/tensor_io.h"

namespace ckpt {

// NonFloatWeight (kUnsupported) naming the tensor, its dtype and `src`, with the hint to name the
// source's profile (--source-profile paddlenlp for a PaddleNLP save), when `t` is not a float tensor.
Status check_float_weight(const TensorMeta& t, const std::string& src);

// True for names of weights and biases (".weight", ".bias"): what a source without a model config
// is checked by.
bool is_weight_name(const std::string& name);

}  // namespace ckpt
