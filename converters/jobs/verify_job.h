// One `ckpt verify` run below the CLI (cli/cmd_verify.cc, python ckpt.verify): opens any
// checkpoint ckpt reads (open_checkpoint: a store in a profile as its canonical view) and runs the
// format's own checks through the source's interface (TensorSource::integrity / check): a native
// store's piece digests (xxh3-128 or sha256, as each piece records, `threads` pieces at a time) and
// manifest checksum, torch zip entries' CRC-32; a format without checksums (safetensors) is
// validated structurally and every byte read back, and the outcome says, by format name, what
// cannot be checked. Failures are collected, not returned as the Status: the Result fails only
// when the path cannot be opened.
// Thread safety: one call per thread.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "formats/base/status.h"
#include "formats/tensor/tensor_io.h"

namespace ckpt {

struct VerifyFailureInfo {
  Status status;                 // names file, dataset or tensor and what differs
  size_t piece = 0;              // index into the checked source's pieces (CheckFailure::kNoPiece: none)
  std::string tensor, file, dataset;  // dataset: the unit checked (native dataset, zip entry), when known
};

struct VerifyOutcome {
  std::string path;            // the store directory (a run dir resolved) or the source's description
  std::string format;          // "ckpt-native v3", "safetensors", "huggingface safetensors directory", ...
  bool checksums = false;      // the format's checksums were recomputed; false: bytes read only
  std::string scheme;          // what was checked ("xxh3-128 piece digests + manifest checksum", "zip CRC-32")
  std::string cannot_check;    // what the format cannot check, by name (empty: nothing)
  std::set<std::string> digests;  // the digest algorithms of the store's pieces
  uint64_t pieces = 0, bytes = 0;
  double seconds = 0;
  std::vector<VerifyFailureInfo> failures;
  bool ok() const { return failures.empty(); }
  // The JSON of `ckpt verify --json`: path, format, ok, structure_ok, checksums, scheme, pieces,
  // bytes, seconds, failures [{code, piece, tensor, file, dataset?, message}], digests, note (what
  // cannot be checked, when anything).
  nlohmann::json to_json() const;
};

// `source_profile` (--source-profile): PATH read in that profile (open_checkpoint_in_profile).
Result<VerifyOutcome> verify_checkpoint(const std::string& path, int threads = 2,
                                        const std::function<void(uint64_t, uint64_t)>& progress = nullptr,
                                        const std::string& source_profile = "");

}  // namespace ckpt
