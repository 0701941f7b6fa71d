// The symmetric layout as the flag values that name it (--tp --pp --dp --zero --pp-layers), before
// the model's layer count is known: what `ckpt reshard`, `ckpt from-hf` and `ckpt train` are given
// (and python's keyword arguments of the same names). parse() reads the flag text once, at the edge;
// make() turns the values into a Layout once the number of layers is known.
// Pure values and functions; thread safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/base/status.h"
#include "reshard/layout/layout.h"

namespace ckpt {

struct LayoutValues {
  int tp = 0, pp = 0, dp = 0, zero = -1;  // 0 / -1: not given
  std::vector<int> pp_layers;             // layers per pipeline stage; empty: an even split
  int ep = 0, etp = 0;                    // expert parallelism (docs/MOE.md); 0: not given (ep 1, etp = tp)

  bool given() const { return tp || pp || dp || zero >= 0 || ep || etp || !pp_layers.empty(); }
  // Requires tp, pp, dp >= 1 (kInvalidArgument naming the flags); pp_layers, when given, must sum to
  // `num_layers` (Layout::make).
  Result<Layout> make(int64_t num_layers) const;
  // The values with --pp-layers given as text ("2,3,3"; "" not given): a list of positive integers,
  // else kInvalidArgument naming --pp-layers.
  static Result<LayoutValues> parse(int tp, int pp, int dp, int zero, const std::string& pp_layers);
};

}  // namespace ckpt
