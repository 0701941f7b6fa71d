#include "formats/store/store_options.h"

namespace ckpt::store {

Result<StoreOptions> parse_compress_spec(const std::string& spec, const std::string& flag, StoreOptions o) {
  std::string name = spec, level;
  if (auto c = spec.find(':'); c != std::string::npos) {
    name = spec.substr(0, c);
    level = spec.substr(c + 1);
  }
  if (name == "none" && level.empty()) {
    o.codec = Codec::kNone;
    return o;
  }
  if (name == "zstd") o.codec = Codec::kZstd;
  else if (name == "shuffle+zstd" || name == "shuffle-zstd") o.codec = Codec::kShuffleZstd;
  else return Status::InvalidArgument(flag + ": expected none, zstd[:LEVEL] or shuffle+zstd[:LEVEL], got '" + spec + "'");
  if (!level.empty()) {
    if (level.size() > 2 || level.find_first_not_of("0123456789") != std::string::npos || std::stoi(level) < 1 ||
        std::stoi(level) > 22)
      return Status::InvalidArgument(flag + ": zstd level must be 1..22, got '" + level + "'");
    o.zstd_level = std::stoi(level);
  }
  return o;
}

Result<StoreOptions> parse_digest_spec(const std::string& spec, const std::string& flag, StoreOptions o) {
  auto algo = digest_algo_from_name(spec);
  if (!algo.ok()) return Status::InvalidArgument(flag + ": expected xxh3-128 or sha256, got '" + spec.substr(0, 64) + "'");
  o.digest = *algo;
  return o;
}

}  // namespace ckpt::store
