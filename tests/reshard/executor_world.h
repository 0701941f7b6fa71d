// Test helpers shared by the executor tests: random tensors whose every element is a unique byte
// pattern, random piece sets (grid boxes, some split into flat ranges), sources built from them
// and a check of every output piece against the naive element-by-element extraction
// (tests/naive_region.h), independent of copy_box/flat_range_to_boxes.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "reshard/memory_io.h"
#include "tests/naive_region.h"

namespace ckpt::exec_test {

using testing_ref::naive_extract;

// Global tensor data: element g (row-major global flat index) is a unique byte pattern.
inline std::vector<uint8_t> make_global(const Shape& shape, size_t es, uint32_t seed) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  std::vector<uint8_t> g(static_cast<size_t>(n) * es);
  std::mt19937 rng(seed);
  for (auto& b : g) b = static_cast<uint8_t>(rng());
  return g;
}


// Random grid split of a shape into boxes.
inline std::vector<Box> random_grid(const Shape& shape, std::mt19937& rng, int max_cuts) {
  std::vector<std::vector<int64_t>> cuts(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    cuts[d] = {0, shape[d]};
    int nc = static_cast<int>(rng() % (max_cuts + 1));
    for (int i = 0; i < nc && shape[d] > 1; ++i) cuts[d].push_back(1 + static_cast<int64_t>(rng() % (shape[d] - 1)));
    std::sort(cuts[d].begin(), cuts[d].end());
    cuts[d].erase(std::unique(cuts[d].begin(), cuts[d].end()), cuts[d].end());
  }
  std::vector<Box> boxes{Box{{}, {}}};
  for (size_t d = 0; d < shape.size(); ++d) {
    std::vector<Box> next;
    for (const Box& b : boxes)
      for (size_t i = 0; i + 1 < cuts[d].size(); ++i) {
        Box nb = b;
        nb.offset.push_back(cuts[d][i]);
        nb.extent.push_back(cuts[d][i + 1] - cuts[d][i]);
        next.push_back(nb);
      }
    boxes = next;
  }
  return boxes;
}

// Random piece set covering `t`: grid boxes, some of which are split into flat ranges.
inline std::vector<Piece> random_pieces(const TensorMeta& t, std::mt19937& rng, DType dt) {
  std::vector<Piece> out;
  for (const Box& b : random_grid(t.shape, rng, 3)) {
    int64_t n = b.numel();
    if (n > 1 && rng() % 2) {
      std::vector<int64_t> cuts{0, n};
      for (int i = 0; i < 3; ++i) cuts.push_back(static_cast<int64_t>(rng() % (n + 1)));
      std::sort(cuts.begin(), cuts.end());
      cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
      for (size_t i = 0; i + 1 < cuts.size(); ++i) out.push_back({t.name, Region{b, cuts[i], cuts[i + 1]}, dt});
    } else {
      out.push_back({t.name, Region{b}, dt});
    }
  }
  return out;
}

struct World {
  std::vector<TensorMeta> tensors;
  std::vector<std::vector<uint8_t>> global;  // per tensor
};

inline World random_world(std::mt19937& rng, DType dt) {
  World w;
  int nt = 1 + static_cast<int>(rng() % 4);
  for (int i = 0; i < nt; ++i) {
    Shape s;
    int nd = static_cast<int>(rng() % 4);  // rank 0..3
    for (int d = 0; d < nd; ++d) s.push_back(1 + static_cast<int64_t>(rng() % 9));
    w.tensors.push_back({"t" + std::to_string(i), dt, s});
    w.global.push_back(make_global(s, dtype_size(dt), static_cast<uint32_t>(rng())));
  }
  return w;
}

inline MemoryCheckpoint make_source(const World& w, const std::vector<Piece>& pieces) {
  MemoryCheckpoint c;
  c.tensors = w.tensors;
  c.pieces = pieces;
  for (const Piece& p : pieces) {
    size_t ti = 0;
    while (w.tensors[ti].name != p.tensor) ++ti;
    c.data.push_back(naive_extract(w.global[ti], w.tensors[ti].shape, p.region, dtype_size(p.dtype)));
  }
  return c;
}

inline void expect_matches(const World& w, const MemoryCheckpoint& out) {
  for (size_t i = 0; i < out.pieces.size(); ++i) {
    const Piece& p = out.pieces[i];
    size_t ti = 0;
    while (w.tensors[ti].name != p.tensor) ++ti;
    auto want = naive_extract(w.global[ti], w.tensors[ti].shape, p.region, dtype_size(p.dtype));
    ASSERT_EQ(out.data[i], want) << "piece " << i << " " << p.tensor << " " << p.region.to_string();
  }
}

}  // namespace ckpt::exec_test
