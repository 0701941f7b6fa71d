// HuggingFace sharded checkpoints: model.safetensors.index.json
// ({"metadata": {"total_size": N}, "weight_map": {tensor: file}}), shard names
// model-00001-of-00003.safetensors, and the shard assignment of HF's splitter (tensors in order;
// a tensor larger than the limit gets its own shard). Pure functions; thread safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/base/json_read.h"
#include "formats/base/status.h"

namespace ckpt::safetensors {

inline constexpr const char* kIndexFileName = "model.safetensors.index.json";
inline constexpr const char* kSingleFileName = "model.safetensors";
inline constexpr uint64_t kMaxIndexBytes = kIndexJsonLimits.max_bytes;

struct ShardIndex {
  std::map<std::string, std::string> weight_map;  // tensor -> file name (no directory part)
  std::vector<std::string> files;                 // distinct files, sorted
  nlohmann::json metadata = nlohmann::json::object();  // "metadata" (total_size, ...)
};

// Parses and validates the index text: a JSON object read by parse_json (kIndexJsonLimits: size,
// nesting, duplicate keys), "weight_map" an
// object of strings, each a plain file name (no '/', '\\', root, "." or "..", no NUL, ending in
// ".safetensors"), "metadata" an object or absent (total_size a non-negative integer when present).
// Codes: those of parse_json (InvalidJson, JsonTooLarge, JsonTooDeep, DuplicateKey), IndexInvalid,
// IndexBadFileName.
Result<ShardIndex> parse_index(std::string_view text);
Result<ShardIndex> read_index(const std::string& path);
// HF's layout: 2-space indent, sorted keys, trailing newline.
std::string index_to_json(uint64_t total_size, const std::map<std::string, std::string>& weight_map);


// model-00001-of-00003.safetensors (i from 0).
std::string hf_shard_file_name(size_t i, size_t n);

// HF's split: walks `sizes` in order; returns the shard number of each entry.
std::vector<size_t> assign_shards(const std::vector<uint64_t>& sizes, uint64_t max_shard_size, size_t* num_shards);

}  // namespace ckpt::safetensors
