// open_checkpoint: the one function every command that takes a checkpoint uses to open it, by
// looking at the path. The kinds live in ONE table (kCheckpointKinds in open_checkpoint.cc), one
// row per kind:
//     {"name", "how it looks (for the error listing every kind)", detect, open},
//   detect: bool(const std::string& path): cheap, looks only at file names (never parses);
//   open:   Result<std::unique_ptr<TensorSource>>(const std::string& path).
// Rows are tried in order and the first whose detect says yes opens the path, so a more
// specific kind sits above a more general one (a Megatron torch_dist directory is also a DCP
// directory: its row comes first). To add a kind, add one row (and its detect/open functions
// next to its source). A path no row recognises is refused with the list of every kind.
// Thread safety: reentrant; the returned source states its own.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "formats/base/status.h"
#include "formats/tensor/tensor_io.h"

namespace ckpt {

struct CheckpointKind {
  const char* name;        // "native-store", "hf-dir", "dcp", ... (inspect/verify print it)
  const char* looks_like;  // "a directory with .metadata and __R_K.distcp files"
  bool (*detect)(const std::string& path);
  Result<std::unique_ptr<TensorSource>> (*open)(const std::string& path);
};

// Every kind, in detection order.
std::span<const CheckpointKind> checkpoint_kinds();

// The kind `path` looks like, or nullptr.
const CheckpointKind* detect_checkpoint(const std::string& path);

// As open_checkpoint, but a native store in a profile as stored (its profile's tensors, not its
// canonical view): for `inspect`.
Result<std::unique_ptr<TensorSource>> open_checkpoint_as_stored(const std::string& path);

// Opens `path` as the first kind that recognises it. NotFound when the path does not exist;
// Unsupported (listing every kind) when no kind recognises it.
Result<std::unique_ptr<TensorSource>> open_checkpoint(const std::string& path);

}  // namespace ckpt
