// manifest.json of the native store, format "ckpt-native" version 1 (spec: docs/STORE_FORMAT.md).
// Parsing is bounded and type-checked; validate_manifest() is the one structural validator that
// both the writer (before committing) and the reader (before any use) run: versions, names,
// dtypes, every region inside its tensor (checked arithmetic), pieces of a tensor never overlap
// and cover it exactly, flat pieces of one box tile it, safe relative file names.
// Thread safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/json_read.h"
#include "formats/status.h"
#include "formats/tensor_io.h"

namespace ckpt::store {

inline constexpr const char* kFormatName = "ckpt-native";
inline constexpr int kFormatVersion = 1;
inline constexpr uint64_t kMaxManifestBytes = kManifestJsonLimits.max_bytes;  // larger manifests are refused
inline constexpr size_t kMaxRank = 32;                      // dimensions of a tensor
inline constexpr const char* kManifestFile = "manifest.json";

enum class Codec : uint8_t { kNone, kZstd, kShuffleZstd };
const char* codec_name(Codec c);  // "none", "zstd", "shuffle+zstd"
Result<Codec> codec_from_name(const std::string& s);

// One stored piece: where its elements live and what they hash to.
struct PieceRecord {
  Piece piece;          // tensor, region, stored dtype
  std::string file;     // relative to the checkpoint dir, e.g. "shards/r00003.h5"
  std::string dataset;  // HDF5 path inside `file`, e.g. "/p000012"
  uint64_t bytes = 0;   // numel * dtype size
  std::string sha256;   // hex of the raw little-endian bytes in storage order
  Codec codec = Codec::kNone;
  int codec_level = 0;  // zstd level when compressed
  bool operator==(const PieceRecord& o) const = default;
};

struct Manifest {
  int version = kFormatVersion;
  nlohmann::json metadata = nlohmann::json::object();  // model_config, layout, trainer, profile...
  std::vector<TensorMeta> tensors;
  std::vector<PieceRecord> pieces;
};

// Top-level keys owned by the format; metadata may not use them.
bool is_reserved_key(const std::string& key);

nlohmann::json piece_record_to_json(const PieceRecord& r);
// Type-checks one piece record (as gathered from other ranks or read from a manifest).
Result<PieceRecord> piece_record_from_json(const nlohmann::json& j);
nlohmann::json manifest_to_json(const Manifest& m);
// Parses (parse_json with kManifestJsonLimits) and type-checks (no geometry); errors: those of
// parse_json (InvalidJson, JsonTooLarge, JsonTooDeep, DuplicateKey), UnknownFormat,
// UnsupportedVersion, BadField.
Result<Manifest> parse_manifest(const std::string& text);

// Checks tensors and pieces: unique tensor names, known dtypes, regions inside tensors, no
// overlap, exact coverage, flat tiling, byte counts. Rule codes: DuplicateTensor, BadShape,
// UnknownTensor, RegionOutOfBounds, PieceOverlap, PieceGap, FlatRangeGap, BadByteCount,
// BadFileName, DuplicateDataset.
// `require_records` also checks file/dataset/bytes/sha256 (off for a sink's begin()).
Status validate_pieces(const std::vector<TensorMeta>& tensors, const std::vector<Piece>& pieces);
Status validate_manifest(const Manifest& m);

// A file name inside a checkpoint: relative, no "..", ".", empty or absolute components.
bool is_safe_relative_path(const std::string& p);

// Reads and parses `<dir>/manifest.json` (bounded), then validate_manifest().
Result<Manifest> load_manifest(const std::string& checkpoint_dir);

}  // namespace ckpt::store
