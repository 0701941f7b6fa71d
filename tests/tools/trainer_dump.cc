// trainer_dump: writes what the reference trainer computes for a config, as raw little-endian
// files plus index.json, so tests/python/test_trainer_vs_torch.py can compare it with
// transformers' LlamaForCausalLM + torch autograd + torch.optim.AdamW.
//   trainer_dump CONFIG OUT_DIR [--seed S] [--batch B] [--seq T] [--steps N] [--lr X]
//                [--warmup W] [--total N] [--grad-accum A] [--f64 1]
// Files: init.bin (parameters after init), grads.bin (gradients of the mean loss of the step-0
// batch), logits.bin ([B*T, V] of that batch), final.bin (parameters after N optimizer steps),
// and (float32 only) run/step-00000000: the initial state as a native checkpoint written by the
// trainer's own save path, for `ckpt to-hf`.
// Default: the float32 trainer (Trainer::train_step). --f64 1: the same model and optimizer code
// (Model<double>, BasicAdamW<double>, optimizer_step<double>) in float64, starting from the
// float32 initial weights exactly (init values rounded through float), so a float64 torch run
// from the exported checkpoint is its independent twin. Element type in index.json "dtype".
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "converters/model/llama_config.h"
#include "trainer/data.h"
#include "trainer/model/model.h"
#include "trainer/train_loop.h"

using namespace ckpt;
using namespace ckpt::trainer;

namespace {

int fail(const Status& s) {
  std::fprintf(stderr, "trainer_dump: %s\n", s.to_string().c_str());
  return 1;
}

// Writes every parameter's values (or grads) to `path`; returns the index entries.
template <class T>
nlohmann::json dump_params(Model<T>& m, const std::string& path, bool grads) {
  std::ofstream f(path, std::ios::binary);
  nlohmann::json idx = nlohmann::json::array();
  int64_t off = 0;
  for (auto* p : m.params()) {
    const auto& v = grads ? p->g : p->w;
    f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
    idx.push_back({{"name", p->name}, {"shape", p->shape}, {"offset", off}});
    off += static_cast<int64_t>(v.size());
  }
  return idx;
}

// Logits, loss and gradients of the step-0 batch (A micro-batches of B sequences; the loss is
// the mean over A*B*T tokens, as in a training step) into `index` and OUT_DIR files.
template <class T>
Status dump_batch0(Model<T>& m, const nlohmann::json& batches, int64_t A, int64_t B, int64_t S,
                   const std::string& out, nlohmann::json* index) {
  std::vector<int32_t> tok = batches[0]["tokens"].get<std::vector<int32_t>>();
  std::vector<int32_t> tgt = batches[0]["targets"].get<std::vector<int32_t>>();
  std::vector<T> logits;
  CKPT_ASSIGN_OR_RETURN(double l0, m.forward(tok.data(), tgt.data(), A * B, S, &logits));
  (*index)["loss"] = l0 / static_cast<double>(A * B * S);
  {
    std::ofstream f(out + "/logits.bin", std::ios::binary);
    f.write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * sizeof(T)));
  }
  m.zero_grad();
  const T scale = T(1) / static_cast<T>(A * B * S);
  for (int64_t a = 0; a < A; ++a) {
    auto r = m.forward_backward(tok.data() + a * B * S, tgt.data() + a * B * S, B, S, scale);
    if (!r.ok()) return r.status();
  }
  (*index)["grads"] = dump_params(m, out + "/grads.bin", true);
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: trainer_dump CONFIG OUT_DIR [--seed S] [--batch B] [--seq T] [--steps N] [--lr X] [--warmup W] [--total N] "
                 "[--grad-accum A] [--f64 1]\n");
    return 2;
  }
  const std::string cfg_path = argv[1], out = argv[2];
  TrainOptions o;
  o.seed = 7;
  o.micro_batch = 2;
  o.seq_len = 16;
  o.steps = 5;
  o.lr = 1e-3;
  o.warmup = 2;
  o.print = false;
  bool f64 = false;
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "--seed") o.seed = std::strtoull(v, nullptr, 10);
    else if (k == "--batch") o.micro_batch = std::atoll(v);
    else if (k == "--seq") o.seq_len = std::atoll(v);
    else if (k == "--steps") o.steps = std::atoll(v);
    else if (k == "--lr") o.lr = std::atof(v);
    else if (k == "--warmup") o.warmup = std::atoll(v);
    else if (k == "--total") o.total_steps = std::atoll(v);
    else if (k == "--grad-accum") o.grad_accum = std::atoll(v);
    else if (k == "--f64") f64 = std::atoi(v) != 0;
    else { std::fprintf(stderr, "trainer_dump: unknown flag %s\n", k.c_str()); return 2; }
  }
  auto cfg = LlamaConfig::from_file(cfg_path);
  if (!cfg.ok()) return fail(cfg.status());
  o.config = *cfg;
  if (!f64) o.out_dir = out + "/run";
  o.async_save = false;
  // Validates the options (the same checks in both modes).
  auto tr = Trainer::create(o);
  if (!tr.ok()) return fail(tr.status());

  nlohmann::json index;
  index["config"] = cfg->to_json();
  index["dtype"] = f64 ? "f64" : "f32";
  const int64_t B = o.micro_batch, S = o.seq_len, A = o.grad_accum;
  TokenStream data = TokenStream::procedural(o.seed);
  nlohmann::json batches = nlohmann::json::array();
  for (int64_t s = 0; s < std::max<int64_t>(o.steps, 1); ++s) {
    std::vector<int32_t> tok(static_cast<size_t>(A * B * S)), tgt(tok.size());
    Status st = data.batch(s, 0, A * B, S, tok.data(), tgt.data());
    if (!st.ok()) return fail(st);
    batches.push_back({{"tokens", tok}, {"targets", tgt}});
  }
  index["batches"] = batches;
  nlohmann::json steps = nlohmann::json::array();

  if (!f64) {
    Trainer& t = **tr;
    Model<float>& m = t.model();
    index["init"] = dump_params(m, out + "/init.bin", false);
    auto saved = t.save(false);  // step 0: the checkpoint `ckpt to-hf` exports
    if (!saved.ok()) return fail(saved.status());
    Status st = dump_batch0(m, batches, A, B, S, out, &index);
    if (!st.ok()) return fail(st);
    for (int64_t s = 0; s < o.steps; ++s) {
      auto r = t.train_step();
      if (!r.ok()) return fail(r.status());
      steps.push_back(Trainer::to_json(*r));
    }
    index["final"] = dump_params(m, out + "/final.bin", false);
  } else {
    auto mr = Model<double>::create(o.config);
    if (!mr.ok()) return fail(mr.status());
    Model<double> m = std::move(mr).value();
    Status st = m.init(o.seed);
    if (!st.ok()) return fail(st);
    for (auto* p : m.params())
      for (double& v : p->w) v = static_cast<double>(static_cast<float>(v));  // = the f32 init
    index["init"] = dump_params(m, out + "/init.bin", false);
    st = dump_batch0(m, batches, A, B, S, out, &index);
    if (!st.ok()) return fail(st);
    BasicAdamW<double> opt(o.adam);
    add_param_slots(m, opt);
    TrainerState state = initial_state(o);
    std::vector<int32_t> tok, tgt;
    for (int64_t s = 0; s < o.steps; ++s) {
      auto r = optimizer_step(m, opt, data, &state, &tok, &tgt);
      if (!r.ok()) return fail(r.status());
      steps.push_back(Trainer::to_json(*r));
    }
    index["final"] = dump_params(m, out + "/final.bin", false);
  }
  index["steps"] = steps;
  index["options"] = {{"seed", o.seed}, {"batch", B}, {"seq", S}, {"steps", o.steps}, {"lr", o.lr},
                      {"warmup", o.warmup}, {"total", o.total_steps < 0 ? o.steps : o.total_steps},
                      {"grad_accum", A}, {"beta1", o.adam.beta1}, {"beta2", o.adam.beta2},
                      {"eps", o.adam.eps}, {"weight_decay", o.adam.weight_decay},
                      {"max_grad_norm", o.max_grad_norm}};
  std::ofstream(out + "/index.json") << index.dump();
  return 0;
}
