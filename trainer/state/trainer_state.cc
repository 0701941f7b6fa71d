#include "trainer/state/trainer_state.h"

#include <cmath>
#include <cstdio>
#include <cstring>

#include "formats/store/run_dir.h"
#include "formats/store/store_reader.h"
#include "reshard/executor.h"
#include "reshard/layout/layout.h"

namespace ckpt::trainer {

nlohmann::json TrainerState::to_json() const {
  return {{"step", step},
          {"lr_schedule", schedule.to_json()},
          {"seed", seed},
          {"data", {{"source", data_source}, {"next_step", step},
                    {"samples_per_step", global_batch}, {"rng", "counter-based (seed, step, sample)"}}},
          {"micro_batch", micro_batch},
          {"seq_len", seq_len},
          {"grad_accum", grad_accum},
          {"adamw", {{"beta1", adam.beta1}, {"beta2", adam.beta2}, {"eps", adam.eps},
                     {"weight_decay", adam.weight_decay}}},
          {"max_grad_norm", max_grad_norm}};
}

std::string TrainerState::out_of_range(const std::string& prefix) const {
  auto in = [&](const char* name, int64_t v, int64_t lo, int64_t hi) -> std::string {
    if (v >= lo && v <= hi) return "";
    return prefix + name + " = " + std::to_string(v) + " (expected in [" + std::to_string(lo) + ", " + std::to_string(hi) + "])";
  };
  for (std::string e : {in("step", step, 0, kMaxSteps), in("micro_batch", micro_batch, 1, kMaxMicroBatch),
                        in("seq_len", seq_len, 1, kMaxSeqLen), in("grad_accum", grad_accum, 1, kMaxGradAccum),
                        in("data.samples_per_step", global_batch, 1, kMaxGlobalBatch)})
    if (!e.empty()) return e;
  if (std::string e = schedule.out_of_range(prefix + "lr_schedule."); !e.empty()) return e;
  if (std::string e = adamw_out_of_range(adam, prefix + "adamw."); !e.empty()) return e;
  if (!(max_grad_norm >= 0 && std::isfinite(max_grad_norm))) {
    char b[64];
    std::snprintf(b, sizeof b, "%.17g", max_grad_norm);
    return prefix + "max_grad_norm = " + b + " (expected a finite value >= 0; 0: no clipping)";
  }
  return "";
}

Result<TrainerState> TrainerState::from_json(const nlohmann::json& j) {
  if (!j.is_object()) return Status::Error("BadTrainerState", "metadata 'trainer': expected an object");
  TrainerState s;
  try {
    s.step = j.at("step").get<int64_t>();
    CKPT_ASSIGN_OR_RETURN(s.schedule, LrSchedule::from_json(j.at("lr_schedule")));
    s.seed = j.at("seed").get<uint64_t>();
    s.data_source = j.at("data").at("source").get<std::string>();
    s.micro_batch = j.at("micro_batch").get<int64_t>();
    s.seq_len = j.at("seq_len").get<int64_t>();
    s.grad_accum = j.at("grad_accum").get<int64_t>();
    s.global_batch = j.at("data").value("samples_per_step", s.micro_batch * s.grad_accum);
    const auto& a = j.at("adamw");
    s.adam.beta1 = a.at("beta1").get<double>();
    s.adam.beta2 = a.at("beta2").get<double>();
    s.adam.eps = a.at("eps").get<double>();
    s.adam.weight_decay = a.at("weight_decay").get<double>();
    s.max_grad_norm = j.at("max_grad_norm").get<double>();
  } catch (const nlohmann::json::exception& e) {
    return Status::Error("BadTrainerState", std::string("metadata 'trainer': ") + e.what());
  }
  int64_t next_step = s.step;
  try {
    if (j.at("data").contains("next_step")) next_step = j.at("data").at("next_step").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    return Status::Error("BadTrainerState", std::string("metadata 'trainer': ") + e.what());
  }
  if (std::string e = s.out_of_range("metadata 'trainer': "); !e.empty()) return Status::Error("TrainerStateOutOfRange", e);
  if (next_step != s.step)
    return Status::Error("TrainerStateOutOfRange", "metadata 'trainer': data.next_step = " + std::to_string(next_step) +
                                                       " differs from step = " + std::to_string(s.step) +
                                                       " (the data cursor of a checkpoint is its step)");
  return s;
}

}  // namespace ckpt::trainer
