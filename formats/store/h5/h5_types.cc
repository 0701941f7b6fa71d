#include "formats/store/h5/h5_types.h"

#include <algorithm>

namespace ckpt::store {

hid_t h5_type_for(DType t) {
  switch (t) {
    case DType::kBool:
    case DType::kU8:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kF8E8M0:
    case DType::kF4: return H5T_STD_U8LE;  // a packed pair of E2M1 values per byte
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

std::vector<hsize_t> piece_chunk_dims(const std::vector<hsize_t>& dims, size_t esize, uint64_t target) {
  std::vector<hsize_t> c(dims.size(), 1);
  uint64_t inner = esize;
  for (size_t i = dims.size(); i-- > 0;) {
    if (inner * dims[i] <= target) {
      c[i] = dims[i];
      inner *= dims[i];
    } else {
      c[i] = std::max<uint64_t>(1, target / inner);
      break;
    }
  }
  return c;
}

std::string dims_string(const std::vector<hsize_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

}  // namespace ckpt::store
