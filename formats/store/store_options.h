// Options of the native store writer (codec, chunk size, fsync, hash threads, digest algorithm, I/O mode,
// source read-ahead)
// and the parsers of the `--compress` and `--digest` specs that set them.
// Thread safety: plain values (read_ahead: shared, thread-safe), pure functions.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "formats/base/status.h"
#include "formats/digest/digest.h"
#include "formats/io/output_file.h"
#include "formats/io/source_blocks.h"
#include "formats/io/write_pool.h"
#include "formats/store/manifest.h"

namespace ckpt::store {

struct StoreOptions {
  Codec codec = Codec::kNone;       // kShuffleZstd: HDF5 shuffle + zstd (filter 32015)
  int zstd_level = 1;
  uint64_t chunk_bytes = 4ull << 20;  // target HDF5 chunk size when compressed
  bool fsync = true;                  // fsync shards, manifest and directories on commit
  int hash_threads = 1;               // threads copying and hashing pieces taken from files (write_from_file)
  DigestAlgo digest = kDefaultDigest; // of every piece written (formats/digest/digest.h)
  IoMode io = IoMode::kAuto;          // how piece bytes are written (formats/io/output_file.h; compressed: direct_vfd.h)
  // Compressed: the memory the chunks in flight may hold (each its raw and its compressed bytes,
  // ~2 x chunk_bytes); 0: as many as keep the pool busy (2 x hash_threads + 1 chunks).
  uint64_t chunk_memory = 0;
  // Uncompressed, io kDirect: the source ranges copied into pieces (write_from_files) are read
  // through this (direct reads, read ahead across pieces; formats/io/source_blocks.h), shared by
  // every shard of the store; null: a window at a time (formats/io/source_window.h).
  std::shared_ptr<SourceBlocks> read_ahead;
  // Uncompressed shards written direct: copies (write_from_files) stage their bytes in this pool's
  // large buffers and write them on its threads, several requests in flight across the shards of
  // the store (formats/io/write_pool.h); null: each copy thread's own stage, one write at a time.
  std::shared_ptr<WritePool> write_pool;
};

// Parses a compression spec: "none", "zstd[:LEVEL]" or "shuffle+zstd[:LEVEL]" (LEVEL 1..22) into
// the codec fields of `base`. Errors (kInvalidArgument) name `flag`.
Result<StoreOptions> parse_compress_spec(const std::string& spec, const std::string& flag, StoreOptions base = {});

// Parses a digest spec, "xxh3-128" or "sha256", into base.digest. Errors (kInvalidArgument) name
// `flag` and the accepted values.
Result<StoreOptions> parse_digest_spec(const std::string& spec, const std::string& flag, StoreOptions base = {});

// Help text of the `--digest` flag (reshard, from-hf, train).
inline constexpr const char* kDigestFlagHelp =
    "digest of every piece written: xxh3-128 (default; fast checksum against accidental corruption) or sha256 "
    "(for digests published or pinned elsewhere)";

}  // namespace ckpt::store
