// What `ckpt inspect` and `ckpt verify` print, computed from any TensorSource (store,
// safetensors, HF directory...) plus optional store-only extras (stored bytes, codecs).
// The JSON form is the stable one (`--json`); text_summary() renders it for people.
// Thread safety: pure functions over a source used by one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/tensor/tensor_io.h"

namespace ckpt::store {

// Optional per-piece extras of a source kind that knows them.
struct SourceExtras {
  std::string format;                              // "ckpt-native v1", "safetensors", ...
  std::function<uint64_t(size_t piece)> stored_bytes;  // bytes on disk of a piece
  std::function<std::string(size_t piece)> codec;      // "none", "shuffle+zstd-1", ...
  std::function<std::string(size_t piece)> file;       // file holding a piece
};

// {"path", "format", "layout": {...}|null, "profile", "step", "tensors": [{name, dtype, shape,
//  pieces, bytes, stored_bytes?}], "totals": {tensors, pieces, files?, bytes, stored_bytes?,
//  compression_ratio?}, "codecs": {...}?}
nlohmann::json summarize_source(const TensorSource& src, const SourceExtras* extras = nullptr);
// The extras `src` knows of its pieces (TensorSource::piece_storage: files, stored bytes, codecs),
// its format named `format`, each piece's storage asked once.
SourceExtras extras_of(TensorSource& src, const std::string& format);
// A "layout_detail" of the general form (set by `ckpt inspect`: pipelines, stages with layers, tp,
// ep, etp (shown when expert parallel), device and ranks) is printed a line per stage; other layouts as "layout: tp=.. pp=.. dp=.. zero=..".
std::string text_summary(const nlohmann::json& summary, bool list_tensors = true);

}  // namespace ckpt::store
