// tp_check: forward + backward of `--micro-batches` micro-batches through a tensor-parallel
// (and optionally pipeline-parallel, --pp: stages chained by send/recv, all forwards then all
// backwards, one activation slot per micro-batch; tied embeddings summed over the first and last
// stage) model shard under mpirun (dp = 1), against the one-process model on the same data and
// weights, which every rank also builds (the config is tiny). Prints on rank 0 one JSON line:
//   {"ok": true, "ranks": [{"rank", "pp_rank", "loss" (null before the last stage), "loss_ref", "worst_rel", "worst_tensor", "numel",
//     "replicated_numel", "full_numel", "vocab": [begin, end]}, ...]}
// worst_rel: the largest |g_shard - g_full| over the rank's boxes, relative to the largest |g| of
// the whole tensor. A model that refuses the layout: {"ok": false, "code", "message"} (exit 3).
//   mpirun -np T*P tp_check CONFIG --tp T [--pp P] [--vocab-divisor D] [--f64 1] [--batch B] [--seq S]
//                              [--micro-batches M]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "converters/model/llama_config.h"
#include "reshard/dist/comm.h"
#include "trainer/model/init.h"
#include "trainer/model/model.h"

using namespace ckpt;
using namespace ckpt::trainer;

namespace {

struct Options {
  std::string config;
  int tp = 1, pp = 1;
  int64_t vocab_divisor = 128, batch = 2, seq = 6, micro_batches = 1;
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

// The micro-batches through this rank's stage: every forward, then every backward (GPipe order,
// one slot each), activations and their gradients sent between neighbouring stages. Returns the
// sum of the token losses (last stage; 0 elsewhere).
template <class T>
Result<double> run_stages(Model<T>& m, LayoutGroups& g, const std::vector<int32_t>& tok,
                          const std::vector<int32_t>& tgt, const Options& o, T scale) {
  const int64_t n = o.batch * o.seq, D = m.config().hidden_size;
  const int M = static_cast<int>(o.micro_batches), prev = g.pp_rank - 1;
  const int next = m.has_head() ? -1 : g.pp_rank + 1;
  m.set_slots(M);
  // Boundary messages: the activations (their gradient) and, for an MoE config, the router totals (aux_dp).
  const int64_t nf = n * D + m.forward_tail(), nb = n * D + m.backward_tail();
  std::vector<T> x(static_cast<size_t>(std::max(nf, nb))), y(x.size());
  double loss = 0;
  for (int j = 0; j < M; ++j) {
    if (prev >= 0) CKPT_RETURN_IF_ERROR(g.pp.recv<T>(x.data(), nf, prev, 0));
    CKPT_ASSIGN_OR_RETURN(double l, m.stage_forward(j, tok.data() + j * n, x.data(), tgt.data() + j * n, o.batch,
                                                    o.seq, scale, y.data()));
    loss += l;
    if (next >= 0) CKPT_RETURN_IF_ERROR(g.pp.send<T>(y.data(), nf, next, 0));
  }
  for (int j = 0; j < M; ++j) {
    if (next >= 0) CKPT_RETURN_IF_ERROR(g.pp.recv<T>(y.data(), nb, next, 1));
    CKPT_RETURN_IF_ERROR(m.stage_backward(j, y.data(), x.data()));
    if (prev >= 0) CKPT_RETURN_IF_ERROR(g.pp.send<T>(x.data(), nb, prev, 1));
  }
  // Tied embeddings: the first and the last stage each hold the tensor; its gradient is the sum.
  if (m.config().tie_word_embeddings && g.embedding.size() > 1) {
    Param<T>* e = m.find("model.embed_tokens.weight");
    CKPT_RETURN_IF_ERROR(g.embedding.all_reduce_sum<T>(e->g.data(), e->numel()));
  }
  return loss;
}

template <class T>
Result<nlohmann::json> run(const Options& o, const LlamaConfig& c, Comm& world) {
  CKPT_ASSIGN_OR_RETURN(Layout layout, Layout::make(o.tp, o.pp, 1, 0, static_cast<int>(c.num_hidden_layers)));
  layout.vocab_divisor = o.vocab_divisor;
  CKPT_ASSIGN_OR_RETURN(LayoutGroups groups, LayoutGroups::make(world, layout));
  auto made = Model<T>::create(c, ModelShard{layout, groups.pp_rank, groups.tp_rank, &groups.tp});
  CKPT_RETURN_IF_ERROR(world.agree(made.status()));
  Model<T> shard = std::move(made).value();
  CKPT_ASSIGN_OR_RETURN(Model<T> full, Model<T>::create(c));
  CKPT_RETURN_IF_ERROR(set_weights(shard));
  CKPT_RETURN_IF_ERROR(set_weights(full));

  const int64_t n = o.batch * o.seq, all = n * o.micro_batches;
  std::vector<int32_t> tok, tgt;
  uint64_t x = 11;
  for (int64_t i = 0; i < 2 * all; ++i) {
    x = splitmix64(x);
    (i < all ? tok : tgt).push_back(static_cast<int32_t>(x % static_cast<uint64_t>(c.vocab_size)));
  }
  const T scale = static_cast<T>(1.0 / static_cast<double>(all));
  double ref = 0;
  for (int64_t j = 0; j < o.micro_batches; ++j) {
    CKPT_ASSIGN_OR_RETURN(double l, full.forward_backward(tok.data() + j * n, tgt.data() + j * n, o.batch, o.seq,
                                                          scale));
    ref += l;
  }
  auto loss = run_stages(shard, groups, tok, tgt, o, scale);
  if (!loss.ok()) world.fail_all(loss.status());
  CKPT_RETURN_IF_ERROR(loss.status());

  nlohmann::json r{{"rank", world.rank()}, {"pp_rank", groups.pp_rank}, {"loss", nullptr}, {"loss_ref", ref}, {"worst_rel", 0.0},
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
  if (shard.has_head()) r["loss"] = *loss;
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
    else if (k == "--pp") o.pp = static_cast<int>(v);
    else if (k == "--micro-batches") o.micro_batches = v;
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
