#include "trainer/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numbers>

namespace ckpt::trainer {

std::string LrSchedule::out_of_range(const std::string& prefix) const {
  auto num = [](double v) {
    char b[64];
    std::snprintf(b, sizeof b, "%.17g", v);
    return std::string(b);
  };
  if (!(peak_lr >= 0 && peak_lr <= kMaxLr))
    return prefix + "peak_lr = " + num(peak_lr) + " (expected a finite value in [0, " + num(kMaxLr) + "])";
  if (!(min_ratio >= 0 && min_ratio <= 1)) return prefix + "min_ratio = " + num(min_ratio) + " (expected in [0, 1])";
  if (warmup < 0 || warmup > kMaxSteps)
    return prefix + "warmup = " + std::to_string(warmup) + " (expected in [0, " + std::to_string(kMaxSteps) + "])";
  if (total_steps < 0 || total_steps > kMaxSteps)
    return prefix + "total_steps = " + std::to_string(total_steps) + " (expected in [0, " + std::to_string(kMaxSteps) + "])";
  return "";
}

double LrSchedule::at(int64_t s) const {
  if (warmup > 0 && s < warmup) return peak_lr * static_cast<double>(s + 1) / static_cast<double>(warmup);
  const double min_lr = min_ratio * peak_lr;
  const double span = static_cast<double>(std::max<int64_t>(1, total_steps - warmup));
  const double p = std::min(1.0, static_cast<double>(s - warmup) / span);
  return min_lr + (peak_lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * p));
}

nlohmann::json LrSchedule::to_json() const {
  return {{"kind", "warmup_cosine"}, {"peak_lr", peak_lr}, {"warmup", warmup},
          {"total_steps", total_steps}, {"min_ratio", min_ratio}};
}

Result<LrSchedule> LrSchedule::from_json(const nlohmann::json& j) {
  if (!j.is_object()) return Status::Error("BadTrainerState", "lr_schedule: expected an object");
  LrSchedule s;
  try {
    if (j.value("kind", std::string()) != "warmup_cosine")
      return Status::Error("BadTrainerState", "lr_schedule.kind: expected 'warmup_cosine'");
    s.peak_lr = j.at("peak_lr").get<double>();
    s.warmup = j.at("warmup").get<int64_t>();
    s.total_steps = j.at("total_steps").get<int64_t>();
    s.min_ratio = j.at("min_ratio").get<double>();
  } catch (const nlohmann::json::exception& e) {
    return Status::Error("BadTrainerState", std::string("lr_schedule: ") + e.what());
  }
  if (std::string e = s.out_of_range("lr_schedule."); !e.empty()) return Status::Error("TrainerStateOutOfRange", e);
  return s;
}

}  // namespace ckpt::trainer
