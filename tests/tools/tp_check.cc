// tp_check: one micro-batch forward + backward of a tensor-parallel model shard, run under
// mpirun (every rank one TP rank, pp = dp = 1), against the one-process model on the same data
// and weights, which every rank also builds (the config is tiny). Prints on rank 0 one JSON line:
//   {"ok": true, "ranks": [{"rank", "loss", "loss_ref", "worst_rel", "worst_tensor", "numel",
//     "replicated_numel", "full_numel", "vocab": [begin, end]}, ...]}
// worst_rel: the largest |g_shard - g_full| over the rank's boxes, relative to the largest |g| of
// the whole tensor. A model that refuses the layout: {"ok": false, "code", "message"} (exit 3).
//   mpirun -np T tp_check CONFIG --tp T [--vocab-divisor D] [--f64 1] [--batch B] [--seq S]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "converters/llama_config.h"
#include "reshard/comm.h"
#include "trainer/init.h"
#include "trainer/model.h"

using namespace ckpt;
using namespace ckpt::trainer;

namespace {

struct Options {
  std::string config;
  int tp = 1;
  int64_t vocab_divisor = 128, batch = 2, seq = 6;
  bool f64 = false;
};

// init (layout independent), then weights scaled x10 and norms 1 + 0.3 u(name, element) so that
// every gradient is far from zero. Norms are whole on every rank, so local index = global index.
template <class T>
Status set_weights(Model<T>& m) {
  CKPT_RETURN_IF_ERROR(m.init(7));
  for (auto* p : m.params()) {
    uint64_t x = fnv1a64(p->name);
    for (auto& v : p->w) {
      x = splitmix64(x);
      const double u = static_cast<double>(x >> 11) * 0x1.0p-53 - 0.5;
      v = p->decay ? static_cast<T>(v * 10) : static_cast<T>(1 + 0.3 * u);
    }
  }
  return Status::Ok();
}

// Largest |shard - full| over the box of `p`, relative to the largest |g| of the full tensor.
template <class T>
double box_error(const Param<T>& p, const Param<T>& full) {
  double mx = 0, err = 0;
  for (T g : full.g) mx = std::max(mx, std::abs(static_cast<double>(g)));
  const int64_t rows = p.box.extent[0], cols = p.box.ndim() > 1 ? p.box.extent[1] : 1;
  const int64_t full_cols = p.shape.size() > 1 ? p.shape[1] : 1;
  const int64_t r0 = p.box.offset[0], c0 = p.box.ndim() > 1 ? p.box.offset[1] : 0;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const double a = static_cast<double>(p.g[static_cast<size_t>(i * cols + j)]);
      const double b = static_cast<double>(full.g[static_cast<size_t>((r0 + i) * full_cols + c0 + j)]);
      err = std::max(err, std::abs(a - b));
    }
  return mx > 0 ? err / mx : err;
}

template <class T>
Result<nlohmann::json> run(const Options& o, const LlamaConfig& c, Comm& world) {
  CKPT_ASSIGN_OR_RETURN(Layout layout, Layout::make(o.tp, 1, 1, 0, static_cast<int>(c.num_hidden_layers)));
  layout.vocab_divisor = o.vocab_divisor;
  CKPT_ASSIGN_OR_RETURN(LayoutGroups groups, LayoutGroups::make(world, layout));
  auto made = Model<T>::create(c, ModelShard{layout, groups.pp_rank, groups.tp_rank, &groups.tp});
  CKPT_RETURN_IF_ERROR(world.agree(made.status()));
  Model<T> shard = std::move(made).value();
  CKPT_ASSIGN_OR_RETURN(Model<T> full, Model<T>::create(c));
  CKPT_RETURN_IF_ERROR(set_weights(shard));
  CKPT_RETURN_IF_ERROR(set_weights(full));

  const int64_t n = o.batch * o.seq;
  std::vector<int32_t> tok, tgt;
  uint64_t x = 11;
  for (int64_t i = 0; i < 2 * n; ++i) {
    x = splitmix64(x);
    (i < n ? tok : tgt).push_back(static_cast<int32_t>(x % static_cast<uint64_t>(c.vocab_size)));
  }
  const T scale = static_cast<T>(1.0 / static_cast<double>(n));
  CKPT_ASSIGN_OR_RETURN(double ref, full.forward_backward(tok.data(), tgt.data(), o.batch, o.seq, scale));
  shard.set_slots(2);  // slot 1: not the slot forward_backward uses
  CKPT_ASSIGN_OR_RETURN(double loss,
                        shard.stage_forward(1, tok.data(), nullptr, tgt.data(), o.batch, o.seq, scale, nullptr));
  CKPT_RETURN_IF_ERROR(shard.stage_backward(1, nullptr, nullptr));

  nlohmann::json r{{"rank", world.rank()}, {"loss", loss}, {"loss_ref", ref}, {"worst_rel", 0.0},
                   {"worst_tensor", ""}, {"numel", shard.num_params()}, {"full_numel", full.num_params()},
                   {"vocab", {shard.vocab_range().begin, shard.vocab_range().end}}};
  int64_t replicated = 0;
  for (auto* p : shard.params()) {
    if (p->tp_replicated) replicated += p->numel();
    Param<T>* f = full.find(p->name);
    if (!f) return Status::Internal("the full model has no " + p->name);
    const double e = box_error(*p, *f);
    if (e >= r["worst_rel"].get<double>()) {
      r["worst_rel"] = e;
      r["worst_tensor"] = p->name;
    }
  }
  r["replicated_numel"] = replicated;
  return r;
}

Result<Options> parse(int argc, char** argv) {
  if (argc < 2) return Status::InvalidArgument("usage: tp_check CONFIG --tp T [--vocab-divisor D] [--f64 1] ...");
  Options o;
  o.config = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const long long v = std::atoll(argv[i + 1]);
    if (k == "--tp") o.tp = static_cast<int>(v);
    else if (k == "--vocab-divisor") o.vocab_divisor = v;
    else if (k == "--f64") o.f64 = v != 0;
    else if (k == "--batch") o.batch = v;
    else if (k == "--seq") o.seq = v;
    else return Status::InvalidArgument("unknown option " + k);
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  auto opts = parse(argc, argv);
  auto cfg = opts.ok() ? LlamaConfig::from_file(opts->config) : Result<LlamaConfig>(opts.status());
  if (!cfg.ok()) {
    std::fprintf(stderr, "tp_check: %s\n", cfg.status().to_string().c_str());
    return 2;
  }
  Comm& world = Comm::world();
  auto r = opts->f64 ? run<double>(*opts, *cfg, world) : run<float>(*opts, *cfg, world);
  if (!r.ok()) {
    if (world.rank() == 0)
      std::printf("%s\n", nlohmann::json{{"ok", false}, {"code", r.status().code()},
                                         {"message", r.status().message()}}.dump().c_str());
    return 3;
  }
  auto all = world.gather(r->dump());
  if (!all.ok()) {
    std::fprintf(stderr, "tp_check: %s\n", all.status().to_string().c_str());
    return 1;
  }
  if (world.rank() == 0) {
    nlohmann::json out{{"ok", true}, {"ranks", nlohmann::json::array()}};
    for (const auto& s : *all) out["ranks"].push_back(nlohmann::json::parse(s));
    std::printf("%s\n", out.dump().c_str());
  }
  return 0;
}
