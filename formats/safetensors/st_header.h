// The safetensors header: parsing with every rule of the reference reader (huggingface/safetensors
// tensor.rs) plus ckpt's stricter ones, and serialization with the reference writer's ordering,
// compact JSON and space padding. Rules and codes: docs/SAFETENSORS.md. Pure functions; thread safe.
//
// File = u64 little-endian N | N bytes UTF-8 JSON header | data buffer (data_offsets relative to it).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "formats/base/status.h"
#include "formats/dtype/dtype.h"
#include "formats/tensor/region.h"

namespace ckpt::safetensors {

inline constexpr uint64_t kMaxHeaderSize = 100'000'000;  // reference MAX_HEADER_SIZE
inline constexpr size_t kMaxDims = 64;                    // ckpt: TooManyDimensions above this

struct TensorEntry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t begin = 0;  // data_offsets, relative to the start of the data buffer
  uint64_t end = 0;
};

struct Header {
  std::vector<TensorEntry> tensors;             // sorted by (begin, end), as validated
  bool has_metadata = false;                    // "__metadata__" present and not null
  std::map<std::string, std::string> metadata;  // "__metadata__"
  uint64_t header_size = 0;                     // N
  uint64_t data_size = 0;                       // bytes of the data buffer (= last end)
  uint64_t data_start() const { return 8 + header_size; }
};

// Reads N from the first 8 bytes and checks it against the file size:
// HeaderTooSmall, HeaderTooLarge, InvalidHeaderLength.
Result<uint64_t> parse_header_size(const uint8_t* first8, uint64_t file_size);

// Parses and validates the N header bytes (UTF-8 check, JSON shape, dtypes, offsets tiling the
// buffer, byte lengths) for a file of `file_size` bytes (MetadataIncompleteBuffer when the data
// buffer is not exactly 8 + N + last end). Pass file_size = UINT64_MAX to skip that last check
// (the writer validating a header before the data exists).
Result<Header> parse_header(std::string_view json, uint64_t file_size);

// Whole in-memory file (fuzz target, tests): parse_header_size + parse_header.
Result<Header> parse_file_bytes(const uint8_t* data, size_t size);

// Reference write order: dtype rank descending (U64 I64 F64 F32 U32 I32 BF16 F16 U16 I16
// F8_E8M0 F8_E4M3 F8_E5M2 I8 U8 F4 BOOL), then name (bytewise).
//
// F4: the header's shape counts values (two per byte); TensorEntry::shape counts packed pairs
// (formats/dtype/dtype.h): parse_header halves the last dimension (odd or no dimension:
// F4OddLastDim), build_header doubles it.
int dtype_write_rank(DType t);

// Assigns data_offsets in reference write order and returns the header bytes, padded with spaces
// to a multiple of 8 (N = returned size). `tensors` is reordered; begin/end are filled in.
// The result is re-parsed with parse_header (the reader's validator) before it is returned.
Result<std::string> build_header(std::vector<TensorEntry>& tensors, const std::map<std::string, std::string>* metadata);

// JSON string literal as serde_json writes it (quotes, \" \\ \b \f \n \r \t, other control
// characters as \u00xx, everything else verbatim).
std::string json_quote(std::string_view s);

}  // namespace ckpt::safetensors
