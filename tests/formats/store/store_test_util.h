// Test helpers for the store: random tensors and piece splits, and naive (index-by-index)
// references that do not use copy_box or the store code under test.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "formats/dtype/dtype.h"
#include "formats/tensor/region.h"
#include "formats/tensor/tensor_io.h"
#include "tests/temp_dir.h"

namespace ckpt::store::testing {

inline std::string temp_dir(const std::string& tag) {
  return ckpt::testing::fresh_temp_dir("store_" + tag).string();
}

// A whole file's bytes ("" when it cannot be read).
inline std::string read_file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// A dense global tensor in memory: bytes row-major.
struct DenseTensor {
  TensorMeta meta;
  std::vector<uint8_t> bytes;
};

inline DenseTensor random_tensor(const std::string& name, DType dt, Shape shape, std::mt19937_64& rng) {
  DenseTensor t{{name, dt, shape}, {}};
  int64_t n = 1;
  for (auto d : shape) n *= d;
  t.bytes.resize(static_cast<size_t>(n) * dtype_size(dt));
  for (auto& b : t.bytes) b = static_cast<uint8_t>(rng());
  return t;
}

// Row-major linear index of global coordinate `idx` in `shape`.
inline int64_t linear(const Shape& shape, const Shape& idx) {
  int64_t l = 0;
  for (size_t d = 0; d < shape.size(); ++d) l = l * shape[d] + idx[d];
  return l;
}

// Elements of `box` of tensor `t`, naive element loop, row-major.
inline std::vector<uint8_t> naive_extract(const DenseTensor& t, const Box& box) {
  const size_t es = dtype_size(t.meta.dtype);
  std::vector<uint8_t> out(static_cast<size_t>(box.numel()) * es);
  const size_t n = box.ndim();
  Shape idx(n, 0);
  for (int64_t k = 0; k < box.numel(); ++k) {
    int64_t rem = k;
    for (size_t d = n; d-- > 0;) {
      idx[d] = box.offset[d] + rem % box.extent[d];
      rem /= box.extent[d];
    }
    std::memcpy(out.data() + k * es, t.bytes.data() + linear(t.meta.shape, idx) * es, es);
  }
  return out;
}

// Storage-order elements of a piece region (flat range of the box's row-major order).
inline std::vector<uint8_t> naive_piece(const DenseTensor& t, const Region& r) {
  auto all = naive_extract(t, r.box);
  if (!r.is_flat()) return all;
  const size_t es = dtype_size(t.meta.dtype);
  return std::vector<uint8_t>(all.begin() + r.flat_begin * es, all.begin() + r.flat_end * es);
}

// Random partition of the whole box into rectangular boxes (recursive splits).
inline void random_split(const Box& b, int depth, std::mt19937_64& rng, std::vector<Box>& out) {
  if (depth == 0 || b.ndim() == 0 || b.numel() <= 1 || rng() % 4 == 0) {
    out.push_back(b);
    return;
  }
  size_t d = rng() % b.ndim();
  if (b.extent[d] < 2) {
    out.push_back(b);
    return;
  }
  int64_t cut = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(b.extent[d] - 1));
  Box lo = b, hi = b;
  lo.extent[d] = cut;
  hi.offset[d] += cut;
  hi.extent[d] -= cut;
  random_split(lo, depth - 1, rng, out);
  random_split(hi, depth - 1, rng, out);
}

// Random pieces covering tensor `t`: boxes, some of them cut into flat ranges.
inline std::vector<Piece> random_pieces(const TensorMeta& t, std::mt19937_64& rng) {
  std::vector<Box> boxes;
  random_split(Box::whole(t.shape), 3, rng, boxes);
  std::vector<Piece> out;
  for (const auto& b : boxes) {
    const int64_t n = b.numel();
    if (n >= 2 && rng() % 3 == 0) {
      int64_t at = 0;
      while (at < n) {
        int64_t len = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(n));
        int64_t e = std::min(n, at + len);
        out.push_back({t.name, Region{b, at, e}, t.dtype});
        at = e;
      }
    } else {
      out.push_back({t.name, Region{b, 0, -1}, t.dtype});
    }
  }
  return out;
}

// A random sub-box of `b` (possibly empty in no dimension).
inline Box random_sub_box(const Box& b, std::mt19937_64& rng) {
  Box s = b;
  for (size_t d = 0; d < b.ndim(); ++d) {
    if (b.extent[d] == 0) continue;
    int64_t lo = static_cast<int64_t>(rng() % static_cast<uint64_t>(b.extent[d]));
    int64_t len = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(b.extent[d] - lo));
    s.offset[d] = b.offset[d] + lo;
    s.extent[d] = len;
  }
  return s;
}

}  // namespace ckpt::store::testing
