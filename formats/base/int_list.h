// Parsing helpers for reshard command-line values: comma-separated integer lists ("2,3,3"); byte
// sizes come from formats/base/byte_size.h. Errors are kInvalidArgument naming the flag.
// Pure functions; thread safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/base/byte_size.h"  // parse_byte_size, the size rule of every flag
#include "formats/base/status.h"

namespace ckpt {

// "2,3,3" -> {2, 3, 3}; every entry a positive integer.
Result<std::vector<int>> parse_int_list(const std::string& s, const std::string& flag);

}  // namespace ckpt
