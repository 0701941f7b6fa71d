// Mapping between ckpt dtypes and the HDF5 types of store datasets. Types HDF5 1.10 cannot name
// portably are stored as unsigned integers of the same width holding the bit pattern:
// BF16 and F16 -> U16 little-endian, F8_E4M3 and F8_E5M2 -> U8, BOOL -> U8 (0/1). The manifest
// dtype is authoritative; each dataset also carries a string attribute "dtype".
// Thread safety: call under h5_lock().
#pragma once

#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "formats/dtype/dtype.h"
#include "formats/tensor/region.h"

namespace ckpt::store {

// A predefined HDF5 type id (not to be closed).
hid_t h5_type_for(DType t);
// True when the dataset type `tid` is the one h5_type_for(t) describes (class, size, sign,
// byte order).
bool h5_type_matches(hid_t tid, DType t);

// Dims of the dataset holding a piece: the box extent (a rank-0 box as [1]) or [numel] for a
// flat range.
std::vector<hsize_t> piece_dataset_dims(const Region& r);
// "[4, 6]": dataset dimensions for messages.
std::string dims_string(const std::vector<hsize_t>& d);
// Chunk dims of a compressed piece dataset of `dims`: row slabs of about `target` bytes (full
// inner dims, a slice of the first dim that does not fit whole, 1 for the dims outside it).
std::vector<hsize_t> piece_chunk_dims(const std::vector<hsize_t>& dims, size_t esize, uint64_t target);

}  // namespace ckpt::store
