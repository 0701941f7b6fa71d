// manifest.json of the native store, format "ckpt-native" (spec: docs/STORE_FORMAT.md). Writers
// write version 3: each piece's "digest": "<algorithm>:<hex>" (xxh3-128 or sha256) guards its
// bytes, and "manifest_digest": "<algorithm>:<hex>" guards the manifest itself: the digest of its
// canonical text (the whole JSON object minus that key, keys sorted, no whitespace:
// canonical_manifest_text), so a relabelled dtype, shape, region, codec, file or dataset name or
// model config is ManifestChecksumMismatch. Readers also accept version 2 (piece digests, no
// manifest checksum) and version 1 (each piece's "sha256": "<hex>", read as a sha256 digest);
// for those, what the manifest says is not checkable (StoreReader::integrity says so).
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

#include "formats/base/json_read.h"
#include "formats/base/status.h"
#include "formats/digest/digest.h"
#include "formats/tensor/tensor_io.h"

namespace ckpt::store {

inline constexpr const char* kFormatName = "ckpt-native";
inline constexpr int kFormatVersion = 4;          // the version every writer writes
// Version 4 is version 3 plus the dtypes F8_E8M0 and F4 (an F4 shape counts packed pairs along its
// last dimension, formats/dtype/dtype.h); a version 1-3 manifest naming them is UnknownDType.
inline constexpr int kFirstLowPrecisionVersion = 4;
inline constexpr int kOldestReadableVersion = 1;  // readers accept kOldestReadableVersion..kFormatVersion
inline constexpr uint64_t kMaxManifestBytes = kManifestJsonLimits.max_bytes;  // larger manifests are refused
inline constexpr size_t kMaxRank = 32;                      // dimensions of a tensor
inline constexpr const char* kManifestFile = "manifest.json";
inline constexpr int kFirstChecksummedVersion = 3;       // versions from this one carry "manifest_digest"
inline constexpr const char* kManifestDigestKey = "manifest_digest";

enum class Codec : uint8_t { kNone, kZstd, kShuffleZstd };
const char* codec_name(Codec c);  // "none", "zstd", "shuffle+zstd"
Result<Codec> codec_from_name(const std::string& s);

// One stored piece: where its elements live and what they hash to.
struct PieceRecord {
  Piece piece;          // tensor, region, stored dtype
  std::string file;     // relative to the checkpoint dir, e.g. "shards/r00003.h5"
  std::string dataset;  // HDF5 path inside `file`, e.g. "/p000012"
  uint64_t bytes = 0;   // numel * dtype size
  DigestValue digest;   // of the raw little-endian bytes in storage order (algorithm + hex)
  Codec codec = Codec::kNone;
  int codec_level = 0;  // zstd level when compressed
  bool operator==(const PieceRecord& o) const = default;
};

struct Manifest {
  int version = kFormatVersion;  // as read (1 to 4); manifest_to_json always writes kFormatVersion
  // The manifest checksum: as read and checked (version 3; empty hex for 1 and 2); its algorithm
  // is the one manifest_to_json writes with (StoreWriter::finalize: the pieces' algorithm).
  DigestValue manifest_digest;
  nlohmann::json metadata = nlohmann::json::object();  // model_config, layout, trainer, profile...
  std::vector<TensorMeta> tensors;
  std::vector<PieceRecord> pieces;
};

// Top-level keys owned by the format (format, version, manifest_digest, tensors, pieces);
// metadata may not use them.
bool is_reserved_key(const std::string& key);

// A piece record in the current version's form ("digest": "<algorithm>:<hex>").
nlohmann::json piece_record_to_json(const PieceRecord& r);
// Type-checks one piece record (as gathered from other ranks or read from a manifest of
// `version`): versions 2 and 3 have "digest" (BadField if it has "sha256"; UnknownDigest for an
// unknown algorithm), version 1 has "sha256" (BadField if it has "digest").
Result<PieceRecord> piece_record_from_json(const nlohmann::json& j, int version = kFormatVersion);
// The manifest in version kFormatVersion's form, sealed: "manifest_digest" is the digest (algorithm
// m.manifest_digest.algo) of canonical_manifest_text of the rest.
nlohmann::json manifest_to_json(const Manifest& m);
// The text a writer commits: manifest_to_json(m) as written, checked to read back through
// parse_manifest (its checksum included); Internal if it does not.
Result<std::string> manifest_text(const Manifest& m);
// What "manifest_digest" is the digest of: `j` without that key, serialized compactly with keys
// sorted (nlohmann's dump(): byte-wise key order, no whitespace, numbers in shortest round-trip
// form, non-ASCII as UTF-8) -- what Python's json.dumps(j, sort_keys=True, separators=(",", ":"),
// ensure_ascii=False) prints for the same document.
std::string canonical_manifest_text(const nlohmann::json& j);
// Parses (parse_json with kManifestJsonLimits), checks the manifest checksum (version 3), then
// type-checks (no geometry). Errors: those of parse_json (InvalidJson, JsonTooLarge, JsonTooDeep,
// DuplicateKey), UnknownFormat, UnsupportedVersion, ManifestChecksumMissing (version 3 without
// "manifest_digest"), ManifestChecksumMismatch (kind checksum), BadField ("manifest_digest"
// malformed, or present before version 3), UnknownDigest.
Result<Manifest> parse_manifest(const std::string& text);

// Pieces of one tensor: the tiling check sweeps them (formats/tensor/tiling.h find_tiling_fault),
// O(n log n) when they are cut along at most two dimensions, more when along three or more. Real
// layouts stay far below: a 405B model at tp 8 with ZeRO over dp 64 stores a tensor in 8 x 64 = 512
// pieces; 2^16 keeps a hostile manifest's check to seconds (TooManyPieces).
inline constexpr size_t kMaxPiecesPerTensor = size_t{1} << 16;

// Checks tensors and pieces: unique tensor names, known dtypes, regions inside tensors, no
// overlap, exact coverage, flat tiling, byte counts, pieces per tensor. Rule codes: DuplicateTensor, BadShape, TooManyPieces,
// UnknownTensor, RegionOutOfBounds, PieceOverlap, PieceGap, FlatRangeGap, BadByteCount,
// BadFileName, DuplicateDataset. `whole` false: the pieces are one shard's part of the store,
// gaps (PieceGap, FlatRangeGap) are not faults.
Status validate_pieces(const std::vector<TensorMeta>& tensors, const std::vector<Piece>& pieces, bool whole = true);
// validate_pieces() plus the records: version readable, safe file names, absolute dataset paths,
// (file, dataset) unique, byte counts, digests well-formed (BadField) and sha256 in version 1.
Status validate_manifest(const Manifest& m);

// A file name inside a checkpoint: relative, no "..", ".", empty or absolute components.
bool is_safe_relative_path(const std::string& p);

// Reads and parses `<dir>/manifest.json` (bounded), then validate_manifest().
Result<Manifest> load_manifest(const std::string& checkpoint_dir);

}  // namespace ckpt::store
