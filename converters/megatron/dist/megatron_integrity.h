// Megatron-Core's own integrity manifest (0.18+, `--verify-integrity`; dist_checkpointing/
// validation.py save_integrity_manifest): `<iter dir>/integrity.json` =
// {"algorithm": "sha256", "files": {"<file name>": "<hex SHA-256>", ...}} over every file of the
// directory but itself, written after metadata.json. ckpt checks it as megatron-core's
// verify_integrity_manifest does: every listed file present with that digest. Names must be plain
// file names of the directory (no '/', '.', '..', NUL); digests 64 lower-case hex digits.
// Thread safety: reentrant.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "formats/base/status.h"
#include "formats/tensor/source_check.h"

namespace ckpt {

inline constexpr const char* kMegatronIntegrityFile = "integrity.json";

struct MegatronIntegrity {
  std::vector<std::pair<std::string, std::string>> files;  // (file name, hex SHA-256), as listed
};

// True when `dir` holds an integrity.json.
bool has_megatron_integrity(const std::string& dir);

// Reads and validates `<dir>/integrity.json`: BadMegatronIntegrity (names the file and the entry)
// or Unsupported for an algorithm other than sha256.
Result<MegatronIntegrity> read_megatron_integrity(const std::string& dir);

// Recomputes each listed file's SHA-256 (files i with (*unit)++ % o.shares == o.share: one unit per
// file) and adds units, bytes and failures to `rep`: MegatronIntegrityMismatch (both digests),
// MegatronIntegrityMissingFile, or the read error, each naming the file. A manifest that cannot
// be read is one failure (share 0's). `on_bytes(n)` after each block hashed.
void check_megatron_integrity(const std::string& dir, const CheckOptions& o, uint64_t* unit,
                              const std::function<void(uint64_t)>& on_bytes, CheckReport& rep);

// The bytes check_megatron_integrity hashes (the listed files' sizes; 0 without a readable manifest).
uint64_t megatron_integrity_bytes(const std::string& dir);

}  // namespace ckpt
