// Layout-independent parameter initialization: element e (flat row-major index in the GLOBAL
// tensor) of parameter `name` gets a value that depends only on (seed, name, e), so any shard
// (a sub-box of the global tensor) can be initialized alone and equals the same slice of the
// whole. Normal(0, 0.02) via splitmix64 counters + Box-Muller; RMSNorm weights are 1.
// Pure functions; thread safe.
#pragma once

#include <cstdint>
#include <string>

#include "formats/base/status.h"
#include "formats/tensor/region.h"

namespace ckpt::trainer {

inline constexpr double kInitStd = 0.02;

uint64_t splitmix64(uint64_t x);
uint64_t fnv1a64(const std::string& s);

// The value of global element `flat_index` of parameter `name` (before the cast to the buffer's
// type). Norm weights (llama_is_norm) are 1; biases 0; everything else N(0, kInitStd).
double init_value(uint64_t seed, const std::string& name, uint64_t flat_index);

// init_value of one parameter with the name's work (norm / bias / key) done once: for callers that
// ask for many elements of the same tensor (init_box, the checkpoint tests' oracles).
class InitValues {
 public:
  InitValues(uint64_t seed, const std::string& name);
  double operator()(uint64_t flat_index) const;

 private:
  int kind_ = 0;  // 0: normal, 1: one (norm weights), 2: zero (biases)
  uint64_t key_ = 0;
};

// Fills `dst` (dense row-major of extent box.extent) with the sub-box `box` of parameter `name`
// whose global shape is `global_shape`. Validates the box against the shape.
template <class T>
Status init_box(uint64_t seed, const std::string& name, const Shape& global_shape, const Box& box,
                T* dst);

}  // namespace ckpt::trainer
