#include "trainer/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace ckpt::trainer {

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
  if (!(s.peak_lr >= 0) || !std::isfinite(s.peak_lr) || s.warmup < 0 || s.total_steps < 0 ||
      !(s.min_ratio >= 0 && s.min_ratio <= 1))
    return Status::Error("BadTrainerState", "lr_schedule: values out of range");
  return s;
}

}  // namespace ckpt::trainer
