// A trainer parameter: canonical name, global shape, the box held here, values and gradients;
// and resize_buffer for activation buffers. Plain data; thread safety as for the owner.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/tensor/region.h"

namespace ckpt::trainer {

// v gets n elements (zeroed when its size changes; kept as is otherwise).
template <class T>
inline void resize_buffer(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) != n) v.assign(static_cast<size_t>(n), T(0));
}

template <class T>
struct Param {
  std::string name;  // canonical HF name, e.g. "model.layers.3.mlp.up_proj.weight"
  Shape shape;       // global shape, HF orientation [out, in]
  Box box;           // the part held here (Box::whole(shape) unless sharded)
  bool decay = true; // AdamW weight decay applies (false for RMSNorm weights)
  bool tp_replicated = false;  // every TP rank holds the same values (norms when tp > 1): counted
                               // once (on TP rank 0) in the global gradient norm
  std::vector<T> w;  // values, dense row-major of box.extent
  std::vector<T> g;  // gradient accumulator, same layout as w

  void allocate(std::string n, Shape s, bool wd);
  // Holds only `b` (a validated box of `s`).
  void allocate(std::string n, Shape s, Box b, bool wd);
  int64_t numel() const { return static_cast<int64_t>(w.size()); }
};

}  // namespace ckpt::trainer
