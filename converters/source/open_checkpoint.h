// open_checkpoint: the one opener of every checkpoint kind ckpt reads, used by every command and
// job that takes a checkpoint, by looking at the path. The kinds live in ONE table
// (kCheckpointKinds in open_checkpoint.cc), one row per kind:
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

// The detect functions of the kinds some jobs treat apart (by file names alone, whatever the
// rows above them say):
// a native checkpoint directory (manifest.json) or run directory (`latest` names the newest);
bool is_native_store(const std::string& path);
// a HuggingFace directory (model.safetensors.index.json or one model.safetensors);
bool is_hf_dir(const std::string& path);
// a regular file named *.safetensors.
bool is_safetensors_file(const std::string& path);

// Opens `path` as the first kind that recognises it; a native store in a profile other than
// "reference" opens as its canonical view (converters/profile/profile_view.h). A model config
// beyond ckpt's bounds (converters/model/llama_config.h) is refused for every kind. NotFound when
// the path does not exist; Unsupported (listing every kind) when no kind recognises it.
Result<std::unique_ptr<TensorSource>> open_checkpoint(const std::string& path);

// As open_checkpoint, but a native store as stored (in its profile's tensors, not its canonical
// view): for `inspect`.
Result<std::unique_ptr<TensorSource>> open_checkpoint_as_stored(const std::string& path);

// Opens `path` with its tensors taken as stored in profile `profile` (--source-profile NAME, a
// built-in profile): an HF or PaddleNLP directory, a .safetensors or .pdparams file opens as the
// canonical view of that profile (converters/paddle/paddlenlp_dir.h open_in_profile: U16 read as
// BF16 when the config's dtype is bfloat16). A native store must record that profile (it records
// its own); other kinds are refused (SourceProfileUnsupported), as is an unknown name (ProfileUnknown).
Result<std::unique_ptr<TensorSource>> open_checkpoint_in_profile(const std::string& path, const std::string& profile);

// Opens `path` as kind `kind` (detect_checkpoint's answer, for a caller that looks at the path
// before it opens it: converters/source/job_source.h), bounded as open_checkpoint; with `as_stored`
// a native store as stored, as open_checkpoint_as_stored.
Result<std::unique_ptr<TensorSource>> open_checkpoint_as(const CheckpointKind& kind, const std::string& path,
                                                         bool as_stored = false);

}  // namespace ckpt
