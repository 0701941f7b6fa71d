// Options of the native store writer (codec, chunk size, fsync, hash threads) and the parser of
// the `--compress` spec that sets the codec fields. Thread safety: plain values, pure function.
#pragma once

#include <cstdint>
#include <string>

#include "formats/status.h"
#include "formats/store/manifest.h"

namespace ckpt::store {

struct StoreOptions {
  Codec codec = Codec::kNone;       // kShuffleZstd: HDF5 shuffle + zstd (filter 32015)
  int zstd_level = 1;
  uint64_t chunk_bytes = 4ull << 20;  // target HDF5 chunk size when compressed
  bool fsync = true;                  // fsync shards, manifest and directories on commit
  int hash_threads = 1;               // threads copying and hashing pieces taken from files (write_from_file)
};

// Parses a compression spec: "none", "zstd[:LEVEL]" or "shuffle+zstd[:LEVEL]" (LEVEL 1..22) into
// the codec fields of `base`. Errors (kInvalidArgument) name `flag`.
Result<StoreOptions> parse_compress_spec(const std::string& spec, const std::string& flag, StoreOptions base = {});

}  // namespace ckpt::store
