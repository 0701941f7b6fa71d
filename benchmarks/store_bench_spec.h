// The model both store benchmarks write (store_bench, store_threads_bench): n tensors
// [8192, 8192] bf16 (128 MiB), each in 2 row pieces (like 2 ranks of a row split).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "formats/dtype/dtype.h"
#include "formats/store/store_writer.h"

namespace ckpt::store::bench {

constexpr size_t kSlab = 16u << 20;  // bytes per write()/read() call
constexpr size_t kPool = 64u << 20;  // distinct random bytes, tiled over the tensors

struct Spec {
  std::vector<TensorMeta> tensors;
  std::vector<Piece> pieces;
  uint64_t bytes = 0;
};

inline Spec make_spec(double gib) {
  Spec s;
  const int n = std::max(1, static_cast<int>(std::lround(gib * 8)));
  for (int i = 0; i < n; ++i) {
    std::string name = "model.layers." + std::to_string(i) + ".mlp.up_proj.weight";
    s.tensors.push_back({name, DType::kBF16, {8192, 8192}});
    s.pieces.push_back({name, Region{Box{{0, 0}, {4096, 8192}}, 0, -1}, DType::kBF16});
    s.pieces.push_back({name, Region{Box{{4096, 0}, {4096, 8192}}, 0, -1}, DType::kBF16});
    s.bytes += 8192ull * 8192 * 2;
  }
  return s;
}

}  // namespace ckpt::store::bench
