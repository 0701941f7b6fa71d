// AdamW over a flat list of parameter slots (name, value buffer, gradient buffer), with
// torch.optim.AdamW semantics (single-tensor path; float for training, double for the exactness
// check against a float64 torch run): decoupled decay p *= 1 - lr*wd,
// m = lerp(m, g, 1-beta1), v = beta2*v + (1-beta2)*g*g, bias corrections, p -= lr/bc1 * m /
// (sqrt(v)/sqrt(bc2) + eps). A slot may be a shard of a parameter (its Region in the global
// tensor is kept for checkpoints), so ZeRO-1 is a different list of slots, not a different
// optimizer. Also: global gradient norm and torch clip_grad_norm_ clipping.
// Thread safety: one thread at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/tensor/region.h"

namespace ckpt::trainer {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

// The ranges AdamW is defined on: betas in [0, 1), eps > 0 and finite (at most kMaxAdamEps),
// weight decay >= 0 and finite (at most kMaxWeightDecay). The upper bounds are far above any
// real run's and only catch a corrupted value (a decay of 1e300 turns every weight into inf).
inline constexpr double kMaxAdamEps = 1.0;
inline constexpr double kMaxWeightDecay = 1e3;
// The first field out of range as "<prefix>beta1 = 2 (expected in [0, 1))", or "" when all hold.
std::string adamw_out_of_range(const AdamWOptions& o, const std::string& prefix);

template <class T>
struct BasicOptSlot {
  std::string name;     // canonical parameter name
  Shape shape;          // the parameter's global shape
  Region region;        // which elements of it this slot holds (row-major order)
  T* w = nullptr;       // [region.numel()] values (the fp32 master weights of this run)
  T* g = nullptr;       // [region.numel()] gradient
  int64_t n = 0;        // region.numel()
  bool decay = true;    // weight decay applies
  std::vector<T> exp_avg;     // [n] Adam first moment
  std::vector<T> exp_avg_sq;  // [n] Adam second moment
};

template <class T>
class BasicAdamW {
 public:
  using Slot = BasicOptSlot<T>;
  explicit BasicAdamW(AdamWOptions o = {}) : opt_(o) {}
  const AdamWOptions& options() const { return opt_; }
  void set_options(const AdamWOptions& o) { opt_ = o; }
  // Adds a slot with zeroed moments.
  void add(std::string name, Shape shape, Region region, T* w, T* g, int64_t n, bool decay);
  std::vector<Slot>& slots() { return slots_; }
  const std::vector<Slot>& slots() const { return slots_; }
  Slot* find(const std::string& name);

  // One update with learning rate `lr`; `step` is the 1-based Adam step count (bias correction).
  void step(double lr, int64_t step);

  // Sum of squared gradients of every slot (double accumulation). Distributed callers sum this
  // over ranks before taking the square root.
  double grad_sq_sum() const;
  // torch clip_grad_norm_: coef = max_norm / (norm + 1e-6), clamped to 1; grads *= coef.
  static T clip_coef(double norm, double max_norm);
  void scale_grads(T coef);

 private:
  AdamWOptions opt_;
  std::vector<Slot> slots_;
};

using OptSlot = BasicOptSlot<float>;
using AdamW = BasicAdamW<float>;

}  // namespace ckpt::trainer
