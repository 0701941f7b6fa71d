// cast_tool: runs ckpt::cast_elements over a raw file, for tests/python/test_casts.py and test_casts_int.py.
//   cast_tool FROM TO IN OUT [--saturate] [--no-nan] [--portable]
// FROM/TO are safetensors dtype names (F32, BF16, F8_E4M3, F8_E8M0, F4 (packed pairs: f4_unpack / f4_pack), ...). IN holds raw little-endian
// elements. Writes OUT (via OUT.tmp + rename) even when the cast reports an error, and prints one
// JSON line of stats: {"ok":..,"code":..,"overflowed":..,"nans":..,"inexact":..,
// "invalid_bool":..,"first_bad":..}. Exit: 0 ok, 3 the cast failed (message on stderr),
// 2 usage or I/O error. Single-threaded.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "formats/dtype/dtype.h"

namespace {

int usage(const char* msg) {
  std::fprintf(stderr, "cast_tool: %s\nusage: cast_tool FROM TO IN OUT [--saturate] [--no-nan] [--portable]\n", msg);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) return usage("missing arguments");
  auto from = ckpt::dtype_from_name(argv[1]);
  auto to = ckpt::dtype_from_name(argv[2]);
  if (!from.ok()) return usage(from.status().to_string().c_str());
  if (!to.ok()) return usage(to.status().to_string().c_str());
  ckpt::CastOptions opts;
  for (int i = 5; i < argc; ++i) {
    if (std::strcmp(argv[i], "--saturate") == 0) opts.overflow = ckpt::OverflowPolicy::kSaturate;
    else if (std::strcmp(argv[i], "--no-nan") == 0) opts.allow_nan = false;
    else if (std::strcmp(argv[i], "--portable") == 0) ckpt::set_cast_portable_only(true);
    else return usage((std::string("unknown flag ") + argv[i]).c_str());
  }
  std::ifstream in(argv[3], std::ios::binary);
  if (!in) return usage((std::string("cannot open ") + argv[3]).c_str());
  std::vector<char> src((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t fs = ckpt::dtype_size(*from), ts = ckpt::dtype_size(*to);
  if (src.size() % fs != 0)
    return usage(("input size " + std::to_string(src.size()) + " is not a multiple of " +
                  std::to_string(fs)).c_str());
  size_t n = src.size() / fs;
  // F4 holds two values per byte: FROM F4 unpacks (2n values), TO F4 packs (n must be even).
  const bool unpack = *from == ckpt::DType::kF4 && *to != ckpt::DType::kF4, pack = *to == ckpt::DType::kF4 && *from != ckpt::DType::kF4;
  if (pack && n % 2 != 0) return usage("packing into F4 takes an even number of values");
  std::vector<char> dst(unpack ? 2 * n * ts : pack ? n / 2 : n * ts);  // [n] elements of TO (F4: pairs)
  ckpt::CastStats stats;
  const auto* s8 = reinterpret_cast<const uint8_t*>(src.data());
  auto* d8 = reinterpret_cast<uint8_t*>(dst.data());
  ckpt::Status st = unpack ? ckpt::f4_unpack(s8, n, d8, *to, opts, &stats)
                    : pack ? ckpt::f4_pack(s8, *from, n / 2, d8, opts, &stats)
                           : ckpt::cast_elements(src.data(), *from, dst.data(), *to, n, opts, &stats);
  const std::string tmp = std::string(argv[4]) + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(dst.data(), static_cast<std::streamsize>(dst.size()));
    if (!out) return usage(("cannot write " + tmp).c_str());
  }
  if (std::rename(tmp.c_str(), argv[4]) != 0) return usage(("cannot rename " + tmp).c_str());
  std::printf("{\"ok\": %s, \"code\": \"%s\", \"overflowed\": %llu, \"nans\": %llu, \"inexact\": %llu, "
              "\"invalid_bool\": %llu, \"first_bad\": %lld}\n",
              st.ok() ? "true" : "false", st.code().c_str(),
              static_cast<unsigned long long>(stats.overflowed), static_cast<unsigned long long>(stats.nans),
              static_cast<unsigned long long>(stats.inexact),
              static_cast<unsigned long long>(stats.invalid_bool), static_cast<long long>(stats.first_bad));
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.to_string().c_str());
    return 3;
  }
  return 0;
}
