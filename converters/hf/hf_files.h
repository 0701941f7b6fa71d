// Side files of a HuggingFace directory (tokenizer, special tokens, generation config) carried
// inside a native checkpoint's metadata, so they survive resharding (the planner copies metadata)
// and come back out on `to-hf`:  metadata["hf_files"] = {name: {"bytes": n, "sha256": hex,
// "base64": data}}. Only the names of hf_side_file_names() are collected or accepted.
// Pure functions and bounded file reads; thread safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/base/status.h"

namespace ckpt {

inline constexpr const char* kHfFilesKey = "hf_files";
inline constexpr uint64_t kMaxHfFileBytes = 64ull << 20;   // per file and in total

// tokenizer.json, tokenizer_config.json, tokenizer.model, special_tokens_map.json,
// added_tokens.json, generation_config.json, vocab.json, merges.txt.
const std::vector<std::string>& hf_side_file_names();

// Reads the side files present in `dir` (symlinks followed, as in the HF hub cache) into the
// "hf_files" object; an empty object when there are none. Errors: kIo, HfFilesTooLarge.
Result<nlohmann::json> collect_hf_files(const std::string& dir);

// Decodes and checks metadata["hf_files"] (absent: empty map): names in the allow list, base64
// valid, size and SHA-256 as recorded. Errors are kCorruption "HfFilesCorrupt" naming the file.
Result<std::map<std::string, std::string>> decode_hf_files(const nlohmann::json& metadata);

std::string base64_encode(std::string_view bytes);
// Standard alphabet with '=' padding; no whitespace. nullopt-like error on anything else.
Result<std::string> base64_decode(std::string_view text);

}  // namespace ckpt
