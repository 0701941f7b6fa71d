// The one bounded JSON reader for every JSON file ckpt reads (manifest.json, config.json, the
// safetensors index, layout files, megatron_args.json) and for a Status crossing processes.
// Rules, each a named kCorruption code (formats/error_codes.cc) whose message names the file:
//   JsonTooLarge  the text is longer than the limit for its kind of file
//   JsonTooDeep   arrays/objects nest deeper than the limit (message gives the byte offset)
//   DuplicateKey  an object lists a key twice (nlohmann would keep the last silently)
//   InvalidJson   not one JSON value (syntax, a NUL byte, trailing bytes; message gives the offset)
// Depth and duplicates are checked while parsing (a SAX handler builds the value), so a hostile
// file never becomes a deep tree: no recursion in the copy, dump or destructor of what is returned.
// Thread safety: reentrant.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "formats/status.h"

namespace ckpt {

struct JsonLimits {
  uint64_t max_bytes = uint64_t{16} << 20;
  int max_depth = 64;  // an object or array at top level is depth 1
};

// Limits per kind of file (the values are far above what any valid file of the kind needs).
inline constexpr JsonLimits kManifestJsonLimits{uint64_t{256} << 20, 64};
inline constexpr JsonLimits kConfigJsonLimits{uint64_t{16} << 20, 32};
inline constexpr JsonLimits kIndexJsonLimits{uint64_t{64} << 20, 16};
inline constexpr JsonLimits kLayoutJsonLimits{uint64_t{16} << 20, 16};
inline constexpr JsonLimits kMegatronArgsJsonLimits{uint64_t{1} << 20, 16};
inline constexpr JsonLimits kStatusJsonLimits{uint64_t{1} << 20, 4};

// Parses `text`; errors name `what` (e.g. "manifest 'x/manifest.json'").
Result<nlohmann::json> parse_json(std::string_view text, const JsonLimits& limits, const std::string& what);

// Reads and parses the regular file `path` (refused unread when larger than the limit); errors
// carry the file (Status::file) and name `what` in the message (e.g. "manifest").
Result<nlohmann::json> read_json_file(const std::string& path, const JsonLimits& limits, const std::string& what);

}  // namespace ckpt
