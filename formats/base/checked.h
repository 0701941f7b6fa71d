// Overflow-checked size arithmetic for untrusted sizes, offsets and shapes.
// Every size computed from file content goes through these before it is used to allocate,
// seek or index. Pure functions; thread safe.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

namespace ckpt {

inline std::optional<uint64_t> checked_add(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}
inline std::optional<uint64_t> checked_mul(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}
inline std::optional<int64_t> checked_add(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}
inline std::optional<int64_t> checked_mul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}
// Product of dimensions; nullopt on a negative dimension or overflow of int64.
inline std::optional<int64_t> checked_numel(std::span<const int64_t> dims) {
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d < 0) return std::nullopt;
    auto m = checked_mul(n, d);
    if (!m) return std::nullopt;
    n = *m;
  }
  return n;
}

}  // namespace ckpt
