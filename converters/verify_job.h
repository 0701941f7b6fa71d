// One `ckpt verify` run below the CLI (cli/cmd_verify.cc, python ckpt.verify): opens any
// checkpoint ckpt reads; a native store has its structure checked and every piece's digest
// recomputed (xxh3-128 or sha256, as each piece records, `threads` pieces at a time); any other
// source (safetensors file, HF directory, Megatron, DCP) is validated structurally and every byte
// of every tensor read back (safetensors has no checksums: the outcome says so). Failures are
// collected, not returned as the Status: the Result fails only when the path cannot be opened.
// Thread safety: one call per thread.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "formats/status.h"
#include "formats/store/store_reader.h"

namespace ckpt {

struct VerifyFailureInfo {
  Status status;                 // names file, dataset or tensor and what differs
  size_t piece = 0;              // index into the source's pieces()
  std::string tensor, file, dataset;  // dataset: native stores only
};

struct VerifyOutcome {
  std::string path;            // the store directory (a run dir resolved) or the source's description
  std::string format;          // "ckpt-native v2", "safetensors", "huggingface safetensors directory", ...
  bool checksums = false;      // true for native stores (digests recomputed); false: bytes read only
  std::set<std::string> digests;  // the digest algorithms of the store's pieces
  uint64_t pieces = 0, bytes = 0;
  double seconds = 0;
  std::vector<VerifyFailureInfo> failures;
  bool ok() const { return failures.empty(); }
  // The JSON of `ckpt verify --json`: path, format, ok, structure_ok, checksums, pieces, bytes,
  // seconds, failures [{code, piece, tensor, file, dataset?, message}], digests | note.
  nlohmann::json to_json() const;
};

// Printed (and in the JSON "note") for sources without checksums.
extern const char* const kVerifyNoChecksumNote;

Result<VerifyOutcome> verify_checkpoint(const std::string& path, int threads = 2,
                                        const std::function<void(uint64_t, uint64_t)>& progress = nullptr);

}  // namespace ckpt
