// trainer_dump: writes what the reference trainer computes for a config, as raw little-endian f32
// files plus index.json, so tests/python/test_trainer_vs_torch.py can compare it with
// transformers' LlamaForCausalLM + torch autograd + torch.optim.AdamW.
//   trainer_dump CONFIG OUT_DIR [--seed S] [--batch B] [--seq T] [--steps N] [--lr X]
//                [--warmup W] [--total N] [--grad-accum A]
// Files: init.bin (parameters after init), grads.bin (gradients of the mean loss of the step-0
// batch), logits.bin ([B*T, V] of that batch), final.bin (parameters after N optimizer steps).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "converters/llama_config.h"
#include "trainer/data.h"
#include "trainer/model.h"
#include "trainer/train_loop.h"

using namespace ckpt;
using namespace ckpt::trainer;

namespace {

int fail(const Status& s) {
  std::fprintf(stderr, "trainer_dump: %s\n", s.to_string().c_str());
  return 1;
}

// Appends every parameter's values (or grads) to `path`; returns the index entries.
nlohmann::json dump_params(Model<float>& m, const std::string& path, bool grads) {
  std::ofstream f(path, std::ios::binary);
  nlohmann::json idx = nlohmann::json::array();
  int64_t off = 0;
  for (auto* p : m.params()) {
    const auto& v = grads ? p->g : p->w;
    f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
    idx.push_back({{"name", p->name}, {"shape", p->shape}, {"offset", off}});
    off += static_cast<int64_t>(v.size());
  }
  return idx;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: trainer_dump CONFIG OUT_DIR [--seed S] [--batch B] [--seq T] [--steps N] [--lr X] [--warmup W] [--total N] [--grad-accum A]\n");
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
    else { std::fprintf(stderr, "trainer_dump: unknown flag %s\n", k.c_str()); return 2; }
  }
  auto cfg = LlamaConfig::from_file(cfg_path);
  if (!cfg.ok()) return fail(cfg.status());
  o.config = *cfg;
  auto tr = Trainer::create(o);
  if (!tr.ok()) return fail(tr.status());
  Trainer& t = **tr;
  Model<float>& m = t.model();
  nlohmann::json index;
  index["config"] = cfg->to_json();
  index["init"] = dump_params(m, out + "/init.bin", false);

  const int64_t B = o.micro_batch, T = o.seq_len, A = o.grad_accum;
  TokenStream data = TokenStream::procedural(o.seed);
  nlohmann::json batches = nlohmann::json::array();
  for (int64_t s = 0; s < std::max<int64_t>(o.steps, 1); ++s) {
    std::vector<int32_t> tok(static_cast<size_t>(A * B * T)), tgt(tok.size());
    Status st = data.batch(s, 0, A * B, T, tok.data(), tgt.data());
    if (!st.ok()) return fail(st);
    batches.push_back({{"tokens", tok}, {"targets", tgt}});
  }
  index["batches"] = batches;

  // Logits, loss and gradients of the step-0 batch (first micro-batch set, mean over A*B*T).
  std::vector<int32_t> tok = batches[0]["tokens"].get<std::vector<int32_t>>();
  std::vector<int32_t> tgt = batches[0]["targets"].get<std::vector<int32_t>>();
  std::vector<float> logits;
  auto l0 = m.forward(tok.data(), tgt.data(), A * B, T, &logits);
  if (!l0.ok()) return fail(l0.status());
  index["loss"] = *l0 / static_cast<double>(A * B * T);
  {
    std::ofstream f(out + "/logits.bin", std::ios::binary);
    f.write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * sizeof(float)));
  }
  m.zero_grad();
  const float scale = 1.0f / static_cast<float>(A * B * T);
  for (int64_t a = 0; a < A; ++a) {
    auto r = m.forward_backward(tok.data() + a * B * T, tgt.data() + a * B * T, B, T, scale);
    if (!r.ok()) return fail(r.status());
  }
  index["grads"] = dump_params(m, out + "/grads.bin", true);

  // N optimizer steps through the training loop.
  nlohmann::json steps = nlohmann::json::array();
  for (int64_t s = 0; s < o.steps; ++s) {
    auto st = t.train_step();
    if (!st.ok()) return fail(st.status());
    steps.push_back(Trainer::to_json(*st));
  }
  index["steps"] = steps;
  index["final"] = dump_params(m, out + "/final.bin", false);
  index["options"] = {{"seed", o.seed}, {"batch", B}, {"seq", T}, {"steps", o.steps}, {"lr", o.lr},
                      {"warmup", o.warmup}, {"total", o.total_steps < 0 ? o.steps : o.total_steps},
                      {"grad_accum", A}, {"beta1", o.adam.beta1}, {"beta2", o.adam.beta2},
                      {"eps", o.adam.eps}, {"weight_decay", o.adam.weight_decay},
                      {"max_grad_norm", o.max_grad_norm}};
  std::ofstream(out + "/index.json") << index.dump();
  return 0;
}
