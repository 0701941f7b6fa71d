#include "formats/dtype/dtype.h"

#include <array>
#include <utility>

namespace ckpt {

namespace {
struct DTypeInfo {
  DType t;
  std::string_view name;
  size_t size;
  bool is_float;
};
constexpr std::array<DTypeInfo, kNumDTypes> kInfo = {{
    {DType::kBool, "BOOL", 1, false}, {DType::kU8, "U8", 1, false},
    {DType::kI8, "I8", 1, false},     {DType::kI16, "I16", 2, false},
    {DType::kU16, "U16", 2, false},   {DType::kI32, "I32", 4, false},
    {DType::kU32, "U32", 4, false},   {DType::kI64, "I64", 8, false},
    {DType::kU64, "U64", 8, false},   {DType::kF16, "F16", 2, true},
    {DType::kBF16, "BF16", 2, true},  {DType::kF32, "F32", 4, true},
    {DType::kF64, "F64", 8, true},    {DType::kF8E4M3, "F8_E4M3", 1, true},
    {DType::kF8E5M2, "F8_E5M2", 1, true},  {DType::kF8E8M0, "F8_E8M0", 1, true},
    {DType::kF4, "F4", 1, true},  // a packed pair of E2M1 values (dtype.h)
}};
}  // namespace

std::string_view dtype_name(DType t) { return kInfo[static_cast<size_t>(t)].name; }
size_t dtype_size(DType t) { return kInfo[static_cast<size_t>(t)].size; }
bool dtype_is_float(DType t) { return kInfo[static_cast<size_t>(t)].is_float; }

Result<DType> dtype_from_name(std::string_view name, bool cli_aliases) {
  for (const auto& i : kInfo)
    if (i.name == name) return i.t;
  if (cli_aliases) {
    if (name == "bf16") return DType::kBF16;
    if (name == "fp16" || name == "f16") return DType::kF16;
    if (name == "fp32" || name == "f32") return DType::kF32;
    if (name == "fp64" || name == "f64") return DType::kF64;
  }
  std::string msg = "unknown dtype '";
  msg.append(name);
  msg += "' (known:";
  for (const auto& i : kInfo) {
    msg += ' ';
    msg.append(i.name);
  }
  msg += ')';
  return Status::Error("UnknownDType", std::move(msg));
}

}  // namespace ckpt
