// open_source: opens any checkpoint ckpt reads as a TensorSource, by looking at the path:
// a .safetensors file, a HuggingFace directory (model.safetensors.index.json or one
// model.safetensors; config.json -> metadata "model_config"), or a native store directory
// (manifest.json). Thread safety: reentrant; the returned source states its own.
#pragma once

#include <memory>
#include <string>

#include "formats/base/status.h"
#include "formats/tensor/tensor_io.h"

namespace ckpt {

enum class SourceKind { kSafetensorsFile, kHfDir, kNativeStore, kUnknown };

// What `path` looks like, without opening tensors.
SourceKind detect_source(const std::string& path);

Result<std::unique_ptr<TensorSource>> open_source(const std::string& path);

}  // namespace ckpt
