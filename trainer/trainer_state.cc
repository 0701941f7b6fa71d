#include "trainer/trainer_state.h"

#include <cstring>

#include "formats/store/run_dir.h"
#include "formats/store/store_reader.h"
#include "reshard/executor.h"
#include "reshard/layout.h"

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
  if (s.step < 0 || s.micro_batch < 1 || s.seq_len < 1 || s.grad_accum < 1 || s.global_batch < 1)
    return Status::Error("BadTrainerState", "metadata 'trainer': step, micro_batch, seq_len, grad_accum out of range");
  return s;
}

}  // namespace ckpt::trainer
