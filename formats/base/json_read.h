// The one bounded JSON reader for every JSON file ckpt reads (manifest.json, config.json, the
// safetensors index, layout files, megatron_args.json) and for a Status crossing processes.
// Rules, each a named kCorruption code (formats/base/error_codes.cc) whose message names the file:
//   JsonTooLarge  the text is longer than the limit for its kind of file
//   JsonTooDeep   arrays/objects nest deeper than the limit (message gives the byte offset)
//   DuplicateKey  an object lists a key twice (nlohmann would keep the last silently)
//   InvalidJson   not one JSON value (syntax, a NUL byte, trailing bytes; message gives the offset)
//   JsonTooManyValues  more values in the file, or more elements in one of its named top-level
//                 arrays, than the limit for its kind of file
// Counts are checked by a first pass that builds nothing, so a hostile file is refused before its
// DOM (about 100 bytes per value) is allocated. Depth and duplicates are checked while parsing (a SAX handler builds the value), so a hostile
// file never becomes a deep tree: no recursion in the copy, dump or destructor of what is returned.
// Thread safety: reentrant.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "formats/base/status.h"

namespace ckpt {

// The elements of the array under one key of the top-level object (e.g. a manifest's "tensors").
struct JsonArrayBound {
  const char* key;
  uint64_t max_elements;
};

struct JsonLimits {
  uint64_t max_bytes = uint64_t{16} << 20;
  int max_depth = 64;  // an object or array at top level is depth 1
  uint64_t max_values = uint64_t{1} << 20;  // every value (scalar, array, object, not keys) in the file
  std::span<const JsonArrayBound> arrays = {};
};

// A manifest's tensor and piece counts (formats/store/manifest.h). The largest real checkpoints
// (a 671B MoE with per-expert tensors and both Adam moments: ~135k tensors; 405B at TP 8 with
// ZeRO over DP 64: ~1.7M pieces, which would not fit kManifestJsonLimits.max_bytes anyway) stay
// below them; they keep a hostile manifest's tensor list (each ~1 KB once parsed and indexed)
// within a few hundred MB: a manifest of 1e6 tensors took 3 GB before these bounds.
inline constexpr uint64_t kMaxManifestTensors = uint64_t{1} << 18;  // 262144
inline constexpr uint64_t kMaxManifestPieces = uint64_t{1} << 21;   // 2097152
inline constexpr JsonArrayBound kManifestArrays[] = {{"tensors", kMaxManifestTensors}, {"pieces", kMaxManifestPieces}};

// Limits per kind of file (the values are far above what any valid file of the kind needs). Value
// counts: a 256 MB manifest holds ~13M values (~20 bytes each); a config or a Megatron args
// namespace a few hundred; a safetensors index one per tensor; a layout one per rank and layer.
inline constexpr JsonLimits kManifestJsonLimits{uint64_t{256} << 20, 64, uint64_t{1} << 24, kManifestArrays};
inline constexpr JsonLimits kConfigJsonLimits{uint64_t{16} << 20, 32, uint64_t{1} << 18};
inline constexpr JsonLimits kIndexJsonLimits{uint64_t{64} << 20, 16, uint64_t{1} << 22};
inline constexpr JsonLimits kLayoutJsonLimits{uint64_t{16} << 20, 16, uint64_t{1} << 22};
inline constexpr JsonLimits kMegatronArgsJsonLimits{uint64_t{1} << 20, 16, uint64_t{1} << 18};
inline constexpr JsonLimits kStatusJsonLimits{uint64_t{1} << 20, 4, uint64_t{1} << 16};

// Parses `text`; errors name `what` (e.g. "manifest 'x/manifest.json'").
Result<nlohmann::json> parse_json(std::string_view text, const JsonLimits& limits, const std::string& what);

// Reads and parses the regular file `path` (refused unread when larger than the limit); errors
// carry the file (Status::file) and name `what` in the message (e.g. "manifest").
Result<nlohmann::json> read_json_file(const std::string& path, const JsonLimits& limits, const std::string& what);

}  // namespace ckpt
