#include "trainer/checkpoint_io.h"

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

void take_snapshot(Model<float>& model, const AdamW& opt, const TrainerState& state, Snapshot* snap) {
  const size_t count = model.params().size();
  const bool reuse = snap->tensors.size() == 3 * count;
  if (!reuse) {
    snap->tensors.clear();
    snap->pieces.clear();
    snap->data.clear();
  }
  size_t k = 0;
  uint64_t bytes = 0;
  auto put = [&](const std::string& name, const Shape& shape, const float* src, int64_t n) {
    if (!reuse) {
      snap->tensors.push_back({name, DType::kF32, shape});
      snap->pieces.push_back({name, Region{Box::whole(shape)}, DType::kF32});
      snap->data.emplace_back(static_cast<size_t>(n));
    }
    std::memcpy(snap->data[k].data(), src, sizeof(float) * static_cast<size_t>(n));
    bytes += sizeof(float) * static_cast<uint64_t>(n);
    ++k;
  };
  auto ps = model.params();
  for (auto* p : ps) put(p->name, p->shape, p->w.data(), p->numel());
  for (const char* kind : {"optimizer.exp_avg.", "optimizer.exp_avg_sq."}) {
    const bool first = std::strcmp(kind, "optimizer.exp_avg.") == 0;
    for (const auto& s : opt.slots())
      put(kind + s.name, s.shape, first ? s.exp_avg.data() : s.exp_avg_sq.data(), s.n);
  }
  auto layout = Layout::make(1, 1, 1, 0, static_cast<int>(model.config().num_hidden_layers));
  nlohmann::json lj = nlohmann::json::object();
  if (layout.ok()) {
    layout->micro_batch = {static_cast<int>(state.micro_batch)};
    lj = layout->to_json();
  }
  snap->metadata = {{"model_config", model.config().to_json()},
                    {"layout", lj},
                    {"trainer", state.to_json()},
                    {"profile", "reference"}};
  snap->step = state.step;
  snap->bytes = bytes;
}

Status write_snapshot(const Snapshot& snap, const std::string& run_dir, const store::StoreOptions& opts) {
  const std::string name = store::step_dir_name(snap.step);
  const std::string dst = run_dir + "/" + name;
  store::StoreWriter w(dst, opts);
  Status st = w.begin(snap.tensors, snap.pieces, snap.metadata);
  for (size_t i = 0; st.ok() && i < snap.pieces.size(); ++i)
    st = w.write(i, snap.data[i].data(), static_cast<int64_t>(snap.data[i].size()));
  if (st.ok()) st = w.commit();
  if (!st.ok()) {
    w.abort();
    return std::move(st).with_context("saving checkpoint " + dst);
  }
  return store::write_latest(run_dir, name);
}

Result<TrainerState> load_checkpoint(const std::string& path, Model<float>& model, AdamW& opt,
                                     const std::function<void(uint64_t, uint64_t)>& progress) {
  CKPT_ASSIGN_OR_RETURN(auto reader, store::StoreReader::open(path));
  const auto& md = reader->metadata();
  const std::string where = reader->describe();
  if (!md.contains("trainer") || !md.contains("model_config"))
    return Status::Error("NotTrainerCheckpoint", "checkpoint '" + where +
                              "' has no 'trainer' or 'model_config' metadata").with_file(where);
  CKPT_ASSIGN_OR_RETURN(auto cfg, LlamaConfig::from_json(md.at("model_config")));
  const LlamaConfig& mine = model.config();
  if (cfg.to_json() != mine.to_json())
    return Status::InvalidArgument("checkpoint '" + where + "' model_config " + cfg.to_json().dump() +
                                   " differs from the training config " + mine.to_json().dump());
  CKPT_ASSIGN_OR_RETURN(auto state, TrainerState::from_json(md.at("trainer")));
  CKPT_ASSIGN_OR_RETURN(SourceIndex index, SourceIndex::build(*reader));
  uint64_t done = 0, total = 0;  // bytes of the weights and both moments, for `progress`
  for (auto* p : model.params()) total += sizeof(float) * static_cast<uint64_t>(p->numel());
  for (const auto& s : opt.slots()) total += 2 * sizeof(float) * static_cast<uint64_t>(s.n);
  auto read = [&](const std::string& name, const Shape& shape, float* dst) -> Status {
    auto it = index.tensor_index.find(name);
    if (it == index.tensor_index.end())
      return Status::NotFound("checkpoint '" + where + "' has no tensor '" + name + "'").with_tensor(name);
    const TensorMeta& meta = reader->tensors()[it->second];
    if (meta.shape != shape)
      return Status::Error("ShapeMismatch", "tensor '" + name + "': expected shape " + shape_to_string(shape) +
                                ", got " + shape_to_string(meta.shape)).with_tensor(name);
    if (const auto* entries = index.find(name))
      for (const auto& e : *entries)
        if (DType dt = reader->pieces()[e.piece].dtype; dt != DType::kF32)
          return Status::Unsupported("tensor '" + name + "' is stored as " + std::string(dtype_name(dt)) +
                                     ": the reference trainer resumes from F32 checkpoints").with_tensor(name);
    CKPT_RETURN_IF_ERROR(read_global_box(*reader, index, name, Box::whole(shape), DType::kF32, dst));
    done += sizeof(float) * static_cast<uint64_t>(Box::whole(shape).numel());
    if (progress) progress(done, total);
    return Status::Ok();
  };
  for (auto* p : model.params()) CKPT_RETURN_IF_ERROR(read(p->name, p->shape, p->w.data()));
  for (auto& s : opt.slots()) {
    CKPT_RETURN_IF_ERROR(read("optimizer.exp_avg." + s.name, s.shape, s.exp_avg.data()));
    CKPT_RETURN_IF_ERROR(read("optimizer.exp_avg_sq." + s.name, s.shape, s.exp_avg_sq.data()));
  }
  return state;
}

}  // namespace ckpt::trainer
