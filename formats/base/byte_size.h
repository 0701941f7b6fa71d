// Byte sizes given on the command line (--max-memory, --max-shard-size), one rule for every flag:
// "1048576" bytes; "64K", "256M", "4G", "1T" and "2KiB".."2TiB" are binary multiples; "10KB",
// "500MB", "5GB", "1TB" are decimal (HuggingFace's max_shard_size convention). Units are
// case-insensitive. And the one way ckpt prints a byte count for people. Pure functions; thread safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "formats/base/status.h"

namespace ckpt {

// Zero, a sign, a missing number, an unknown unit or a value above 2^63-1 is kInvalidArgument
// naming `what` (the flag) and the text.
Result<uint64_t> parse_byte_size(std::string_view text, std::string_view what);

// Binary units with two decimals: "512 B", "1.50 KiB", "3.00 GiB" (TiB is the largest unit).
std::string human_bytes(uint64_t bytes);

}  // namespace ckpt
