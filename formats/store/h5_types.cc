#include "formats/store/h5_types.h"

namespace ckpt::store {

hid_t h5_type_for(DType t) {
  switch (t) {
    case DType::kBool:
    case DType::kU8:
    case DType::kF8E4M3:
    case DType::kF8E5M2: return H5T_STD_U8LE;
    case DType::kI8: return H5T_STD_I8LE;
    case DType::kI16: return H5T_STD_I16LE;
    case DType::kU16:
    case DType::kF16:
    case DType::kBF16: return H5T_STD_U16LE;
    case DType::kI32: return H5T_STD_I32LE;
    case DType::kU32: return H5T_STD_U32LE;
    case DType::kI64: return H5T_STD_I64LE;
    case DType::kU64: return H5T_STD_U64LE;
    case DType::kF32: return H5T_IEEE_F32LE;
    case DType::kF64: return H5T_IEEE_F64LE;
  }
  return H5T_STD_U8LE;
}

bool h5_type_matches(hid_t tid, DType t) {
  return H5Tequal(tid, h5_type_for(t)) > 0;
}

std::vector<hsize_t> piece_dataset_dims(const Region& r) {
  if (r.is_flat()) return {static_cast<hsize_t>(r.numel())};
  if (r.box.ndim() == 0) return {1};
  return std::vector<hsize_t>(r.box.extent.begin(), r.box.extent.end());
}

}  // namespace ckpt::store
