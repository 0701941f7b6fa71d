// Learning-rate schedule: linear warm-up to the peak, then cosine decay to min_ratio * peak at
// total_steps (held there after). Step indices are 0-based: at(s) is the LR of the update that
// makes the step count s+1. The state is plain values (saved in the checkpoint's trainer object).
// Pure values; thread safe.
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

#include "formats/base/status.h"

namespace ckpt::trainer {

// Bounds of a schedule (and of a trainer's step count): a learning rate above kMaxLr is no real
// run's (they stay below 1) and turns the loss into NaN; kMaxSteps (2^40 steps, ~35,000 years at
// one step a millisecond) keeps step arithmetic (bias corrections, data cursors) far from overflow.
inline constexpr double kMaxLr = 1e3;
inline constexpr int64_t kMaxSteps = int64_t{1} << 40;

struct LrSchedule {
  double peak_lr = 3e-3;
  int64_t warmup = 0;
  int64_t total_steps = 1;
  double min_ratio = 0.1;

  // warmup > 0 and s < warmup: peak * (s + 1) / warmup;
  // else: p = min(1, (s - warmup) / max(1, total - warmup)),
  //       lr = min + (peak - min) * (1 + cos(pi * p)) / 2 with min = min_ratio * peak.
  double at(int64_t s) const;

  nlohmann::json to_json() const;
  // Reads and range-checks (check()): "BadTrainerState" for a missing field or a wrong type,
  // "TrainerStateOutOfRange" naming the field, its value and the range.
  static Result<LrSchedule> from_json(const nlohmann::json& j);
  // The first field out of range as "<prefix>peak_lr = 1e308 (expected ...)", or "".
  std::string out_of_range(const std::string& prefix) const;
};

}  // namespace ckpt::trainer
