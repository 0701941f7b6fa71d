#include "formats/torch/pickle/py_object.h"

#include <iterator>

namespace ckpt::torch {

const char* py_type_name(PyType t) {
  switch (t) {
    case PyType::kNone: return "None";
    case PyType::kBool: return "bool";
    case PyType::kInt: return "int";
    case PyType::kFloat: return "float";
    case PyType::kStr: return "str";
    case PyType::kBytes: return "bytes";
    case PyType::kList: return "list";
    case PyType::kTuple: return "tuple";
    case PyType::kDict: return "dict";
    case PyType::kStorage: return "storage";
    case PyType::kTensor: return "tensor";
    case PyType::kRecord: return "record";
  }
  return "?";
}

const PyObj* PyObj::get(std::string_view key) const {
  const PyObj* d = this;
  if (type == PyType::kRecord) {
    d = state;
    // (dict, slots) state: the first dict holds the attributes.
    if (d != nullptr && d->type == PyType::kTuple && !d->items.empty()) d = d->items[0];
  }
  if (d == nullptr || d->type != PyType::kDict) return nullptr;
  for (const auto& [k, v] : d->entries)
    if (k != nullptr && k->type == PyType::kStr && k->s == key) return v;
  return nullptr;
}

namespace {

struct TorchDTypeNames {
  DType dtype;
  const char* torch_name;     // torch.<name>
  const char* storage_class;  // torch.<class>; nullptr: saved as an UntypedStorage (+ dtype)
};

// torch/storage.py _dtype_to_storage_type_map: the legacy typed storages. Newer dtypes (uint16/32/64,
// float8) have no storage class of their own: torch.save writes them as torch.storage.UntypedStorage
// through torch._utils._rebuild_tensor_v3 with the dtype as an argument.
constexpr TorchDTypeNames kTorchDTypes[] = {
    {DType::kBool, "bool", "BoolStorage"},
    {DType::kU8, "uint8", "ByteStorage"},
    {DType::kI8, "int8", "CharStorage"},
    {DType::kI16, "int16", "ShortStorage"},
    {DType::kU16, "uint16", nullptr},
    {DType::kI32, "int32", "IntStorage"},
    {DType::kU32, "uint32", nullptr},
    {DType::kI64, "int64", "LongStorage"},
    {DType::kU64, "uint64", nullptr},
    {DType::kF16, "float16", "HalfStorage"},
    {DType::kBF16, "bfloat16", "BFloat16Storage"},
    {DType::kF32, "float32", "FloatStorage"},
    {DType::kF64, "float64", "DoubleStorage"},
    {DType::kF8E4M3, "float8_e4m3fn", nullptr},
    {DType::kF8E5M2, "float8_e5m2", nullptr},
    {DType::kF8E8M0, "float8_e8m0fnu", nullptr},
    {DType::kF4, "float4_e2m1fn_x2", nullptr},  // torch's packed pair, as ckpt's F4 element
};

// Aliases torch also accepts as attribute names of the same dtype objects (torch.float is
// torch.float32; pickles name the canonical one, but hand-written records may use these).
struct TorchDTypeAlias {
  const char* name;
  DType dtype;
};
constexpr TorchDTypeAlias kTorchDTypeAliases[] = {
    {"half", DType::kF16}, {"float", DType::kF32}, {"double", DType::kF64},
    {"short", DType::kI16}, {"int", DType::kI32}, {"long", DType::kI64},
};

std::string_view strip_torch_prefix(std::string_view s) {
  constexpr std::string_view kPrefix = "torch.";
  if (s.substr(0, kPrefix.size()) == kPrefix) s.remove_prefix(kPrefix.size());
  return s;
}

}  // namespace

bool dtype_from_torch_name(std::string_view torch_name, DType* out) {
  std::string_view n = strip_torch_prefix(torch_name);
  for (const auto& e : kTorchDTypes)
    if (n == e.torch_name) {
      *out = e.dtype;
      return true;
    }
  for (const auto& a : kTorchDTypeAliases)
    if (n == a.name) {
      *out = a.dtype;
      return true;
    }
  return false;
}

std::string torch_dtype_name(DType t) {
  for (const auto& e : kTorchDTypes)
    if (e.dtype == t) return std::string("torch.") + e.torch_name;
  return "torch.?";
}

bool dtype_from_storage_class(std::string_view storage_class, DType* out) {
  std::string_view n = strip_torch_prefix(storage_class);
  for (const auto& e : kTorchDTypes)
    if (e.storage_class != nullptr && n == e.storage_class) {
      *out = e.dtype;
      return true;
    }
  // The untyped storage (bytes) that torch.save uses for dtypes without a storage class.
  if (n == "storage.UntypedStorage" || n == "UntypedStorage") {
    *out = DType::kU8;
    return true;
  }
  return false;
}

std::string storage_class_name(DType t) {
  for (const auto& e : kTorchDTypes)
    if (e.dtype == t) return e.storage_class != nullptr ? std::string("torch.") + e.storage_class : "torch.storage.UntypedStorage";
  return "torch.storage.UntypedStorage";
}

}  // namespace ckpt::torch
