#include "converters/model/weight_dtype.h"

namespace ckpt {

Status check_float_weight(const TensorMeta& t, const std::string& src) {
  if (dtype_is_float(t.dtype)) return Status::Ok();
  std::string hint = t.dtype == DType::kU16
                         ? " (U16 is how PaddleNLP stores bfloat16: if '" + src +
                               "' was saved by PaddleNLP, name its profile with --source-profile paddlenlp or paddlenlp-fused, "
                               "and keep its config.json with \"dtype\": \"bfloat16\")"
                         : " (name the source's profile with --source-profile if its stack stores floats as integers)";
  return Status::Error("NonFloatWeight", "tensor '" + t.name + "' of '" + src + "' is " + std::string(dtype_name(t.dtype)) +
                                             " where a float weight is expected; refused rather than passed through as " +
                                             std::string(dtype_name(t.dtype)) + hint)
      .with_tensor(t.name);
}

bool is_weight_name(const std::string& name) { return name.ends_with(".weight") || name.ends_with(".bias"); }

}  // namespace ckpt
