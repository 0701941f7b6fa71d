// PyTorch Distributed Checkpoint (torch.distributed.checkpoint, torchtitan, Megatron-Core
// torch_dist) directories: `.metadata` (a pickle of dcp Metadata, read by the restricted
// unpickler) and `__R_K.distcp` data files. Every chunk of every tensor is a piece at its box;
// tensor items are read in place in their .distcp file (an embedded torch.save zip at that range,
// or raw bytes in the newer format); bytes items (BytesStorageMetadata) are listed, not tensors.
// Validation before use: chunks inside their tensor and not overlapping, every chunk's storage
// entry present with its file inside the directory, offset + length inside the file, the item's
// byte size equal to the chunk's elements times the dtype size.
// Thread safety: DcpMetadata is a value; a DCP source is used by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "formats/base/status.h"
#include "formats/tensor/region.h"
#include "formats/tensor/tensor_io.h"

namespace ckpt::torch {

struct DcpChunk {
  Shape offsets;               // in the global tensor
  Shape sizes;
  std::string file;            // relative path of the .distcp file
  uint64_t offset = 0;         // byte range of the item in that file
  uint64_t length = 0;
  bool raw = false;            // read_dcp_metadata: the item is the chunk's bytes as they are
                               // (row-major, little-endian), not an embedded torch.save zip
};

struct DcpTensor {
  std::string fqn;
  DType dtype = DType::kF32;
  Shape size;                  // global shape
  std::vector<DcpChunk> chunks;
};

struct DcpBytesItem {
  std::string fqn;
  std::string file;
  uint64_t offset = 0, length = 0;
};

struct DcpMetadata {
  std::vector<DcpTensor> tensors;   // in .metadata order
  std::vector<DcpBytesItem> bytes;
  std::string version;              // Metadata.version ("1.0.0" from torch 2.4 on; "" before)
};

// Bounds on what a .metadata file may declare (a hostile file fails with DcpTooLarge).
inline constexpr uint64_t kMaxDcpMetadataBytes = uint64_t{1} << 30;
inline constexpr size_t kMaxDcpEntries = size_t{1} << 22;        // tensors + bytes items
inline constexpr size_t kMaxDcpChunks = size_t{1} << 22;         // chunks, all tensors together
inline constexpr size_t kMaxDcpRank = 32;                        // dimensions of one tensor

// True when `dir` holds a `.metadata` file.
bool is_dcp_dir(const std::string& dir);

// Reads and validates `<dir>/.metadata` (and the .distcp sizes it refers to).
Result<DcpMetadata> read_dcp_metadata(const std::string& dir);

// Parses the bytes of a .metadata file (fuzz target): structure only, no file checks.
Result<DcpMetadata> parse_dcp_metadata(std::string_view bytes);

// A DCP directory as a TensorSource: tensors under their DCP keys (no renaming; the Megatron
// and HF mappings sit on top), every non-empty chunk one piece (embedded zip items checked at open:
// one tensor of the chunk's sizes and dtype, DcpItemMismatch). metadata(): {"dcp": {"version",
// "bytes": [fqn...], "files": [...]}}, plus "model_config" (config.json of the directory or its
// parent) when the keys are HF LLaMA names. docs/DCP.md.
Result<std::unique_ptr<TensorSource>> open_dcp_dir(const std::string& dir);

// The metadata an open_dcp_dir source was opened with (nullptr when `src` is not one): its bytes
// items (e.g. Megatron-Core 0.19's common_state) without reading .metadata again.
const DcpMetadata* dcp_metadata_of(const TensorSource& src);

// DcpBadPath unless `rel` is a relative path inside the directory (not empty, not absolute, no
// '..' component, no NUL); `fqn` names the item in the error.
Status check_dcp_relative_path(const std::string& rel, const std::string& fqn);

// Reads a bytes item whole (e.g. a Megatron common state), at most `max_bytes`.
Result<std::string> read_dcp_bytes(const std::string& dir, const DcpBytesItem& item, uint64_t max_bytes);

}  // namespace ckpt::torch
