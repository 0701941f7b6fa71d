// Parsing helpers for reshard command-line values: byte sizes ("256M", "4GiB", "1000000") and
// comma-separated integer lists ("2,3,3"). Errors are kInvalidArgument naming the flag.
// Pure functions; thread safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/status.h"

namespace ckpt {

// "123", "64K", "256M", "4G", "1T" (binary multiples; optional "B"/"iB" suffix, case-insensitive).
Result<uint64_t> parse_byte_size(const std::string& s, const std::string& flag);
// "2,3,3" -> {2, 3, 3}; every entry a positive integer.
Result<std::vector<int>> parse_int_list(const std::string& s, const std::string& flag);

}  // namespace ckpt
