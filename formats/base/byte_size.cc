#include "formats/base/byte_size.h"

#include <cctype>
#include <cstdio>
#include <cstdint>
#include <string>
#include <utility>

#include "formats/base/checked.h"

namespace ckpt {

Result<uint64_t> parse_byte_size(std::string_view text, std::string_view what) {
  const std::string where = std::string(what) + ": '" + std::string(text) + "'";
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument(where + " " + why +
                                   " (examples: 1048576, 64K, 256M, 4G, 2GiB; 5GB = 5e9 bytes as in HuggingFace)");
  };
  size_t i = 0;
  uint64_t v = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    auto m = checked_mul(v, uint64_t{10});
    auto a = m ? checked_add(*m, static_cast<uint64_t>(text[i] - '0')) : std::nullopt;
    if (!a) return bad("is too large");
    v = *a;
    ++i;
  }
  if (i == 0) return bad("is not a size: expected a number with an optional unit");
  std::string unit(text.substr(i));
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  static const std::pair<const char*, uint64_t> kUnits[] = {
      {"", 1},           {"B", 1},
      {"K", 1ull << 10}, {"M", 1ull << 20},   {"G", 1ull << 30},         {"T", 1ull << 40},
      {"KIB", 1ull << 10}, {"MIB", 1ull << 20}, {"GIB", 1ull << 30},     {"TIB", 1ull << 40},
      {"KB", 1000},      {"MB", 1000000},     {"GB", 1000000000ull},     {"TB", 1000000000000ull}};
  for (const auto& [name, mul] : kUnits) {
    if (unit != name) continue;
    auto r = checked_mul(v, mul);
    if (!r || *r > static_cast<uint64_t>(INT64_MAX)) return bad("is too large");
    if (*r == 0) return bad("must be positive");
    return *r;
  }
  return bad("has an unknown unit (B, K/M/G/T or KiB..TiB binary, KB/MB/GB/TB decimal)");
}

std::string human_bytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024.0 && u < 4) v /= 1024.0, ++u;
  char buf[48];
  if (u == 0) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  else std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

}  // namespace ckpt
