// dist_ckpt_check: drives trainer/state/dist_checkpoint.h under mpirun for
// tests/python/test_trainer_dist_ckpt.py, with an independent oracle for every element.
//   dist_ckpt_check save CONFIG LAYOUT RUN_DIR STEPS [sync]
//   dist_ckpt_check load CONFIG LAYOUT PATH
// LAYOUT: "tp,dp,zero,a:b:c" (layers per stage). Every rank allocates what rank_view says it
// holds under LAYOUT. save: fills it with value(name, global element) and saves each step of
// STEPS ("1,2"; async unless `sync`), waiting after each. load: zeroes it, dist_load()s PATH and
// checks every element against value(). Errors: "error: <status>" on stderr, exit 1; rank 0
// prints "ok" on success.
// value(name, e) = init_value(7, name, e) + 1e-4 * (e % 4099): distinct within a tensor, so a
// misplaced element is caught even in norms (init 1).
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "converters/model/llama_config.h"
#include "converters/model/llama_sharding.h"
#include "reshard/dist/comm.h"
#include "reshard/planner.h"
#include "trainer/model/init.h"
#include "trainer/optim/held_region.h"
#include "trainer/state/dist_checkpoint.h"

using namespace ckpt;
using namespace ckpt::trainer;

namespace {

// value(name, e) of one tensor (the name's key computed once: the tool fills tens of millions of
// elements, under the sanitizers too).
struct TensorValues {
  InitValues init;
  explicit TensorValues(const std::string& name) : init(7, name) {}
  float operator()(int64_t e) const {
    return static_cast<float>(init(static_cast<uint64_t>(e)) + 1e-4 * static_cast<double>(e % 4099));
  }
};

int fail(const Status& s) {
  std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
  std::fflush(stderr);
  return 1;
}

std::vector<int> ints(const std::string& s, char sep) {
  std::vector<int> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, sep);) out.push_back(std::atoi(x.c_str()));
  return out;
}

Result<Layout> parse_layout(const std::string& spec, int layers) {
  std::vector<std::string> parts;
  std::stringstream ss(spec);
  for (std::string x; std::getline(ss, x, ',');) parts.push_back(x);
  if (parts.size() != 4) return Status::InvalidArgument("layout spec 'tp,dp,zero,a:b:c' expected, got " + spec);
  std::vector<int> per = ints(parts[3], ':');
  return Layout::make(std::atoi(parts[0].c_str()), static_cast<int>(per.size()), std::atoi(parts[1].c_str()),
                      std::atoi(parts[2].c_str()), layers, per);
}

// Calls fn(k, g) for every element k (storage order) of region r of a tensor of shape `shape`, g
// its global flat index: the box index advanced element by element, no work per call beyond it.
template <class Fn>
void for_each_element(const Shape& shape, const Region& r, Fn fn) {
  const Box& b = r.box;
  const size_t nd = b.ndim();
  const int64_t n = r.numel();
  std::vector<int64_t> idx(nd);
  int64_t rem = r.is_flat() ? r.flat_begin : 0;
  for (size_t d = nd; d-- > 0;) {
    idx[d] = rem % b.extent[d];
    rem /= b.extent[d];
  }
  for (int64_t k = 0; k < n; ++k) {
    int64_t g = 0;
    for (size_t d = 0; d < nd; ++d) g = g * shape[d] + (b.offset[d] + idx[d]);
    fn(k, g);
    for (size_t d = nd; d-- > 0;) {
      if (++idx[d] < b.extent[d]) break;
      idx[d] = 0;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: dist_ckpt_check save|load CONFIG LAYOUT PATH [STEPS [sync]]\n");
    return 2;
  }
  const std::string mode = argv[1];
  Comm& world = Comm::world();
  auto cfg = LlamaConfig::from_file(argv[2]);
  if (!cfg.ok()) return fail(cfg.status());
  auto layout = parse_layout(argv[3], static_cast<int>(cfg->num_hidden_layers));
  if (!layout.ok()) return fail(layout.status());
  const std::vector<TensorMeta> tensors = trainer_tensors(*cfg);
  LlamaShardingRules rules(*cfg);
  auto view = rank_view(tensors, *layout, rules, world.rank());
  if (!view.ok()) return fail(view.status());
  std::vector<std::vector<float>> bufs;
  std::vector<HeldRegion> held;
  std::vector<Shape> shapes;
  for (const Piece& p : *view) {
    bufs.emplace_back(static_cast<size_t>(p.region.numel()), 0.f);
    for (const TensorMeta& t : tensors)
      if (t.name == p.tensor) shapes.push_back(t.shape);
  }
  for (size_t i = 0; i < view->size(); ++i) held.push_back({(*view)[i].tensor, (*view)[i].region, bufs[i].data()});
  if (mode == "save") {
    for (size_t i = 0; i < held.size(); ++i) {
      const TensorValues value(held[i].tensor);
      float* buf = bufs[i].data();
      for_each_element(shapes[i], held[i].region, [&](int64_t k, int64_t g) { buf[k] = value(g); });
    }
    DistSaver saver(world, *cfg, *layout, argv[4]);
    const bool sync = argc > 6 && std::string(argv[6]) == "sync";
    for (int step : ints(argc > 5 ? argv[5] : "1", ',')) {
      nlohmann::json md = {{"model_config", cfg->to_json()}, {"trainer", {{"step", step}}}};
      Status st = saver.save(held, md, step, !sync);
      if (st.ok()) st = saver.wait();
      if (!st.ok()) return fail(st);
    }
  } else if (mode == "load") {
    auto md = dist_load(world, argv[4], *cfg, *layout, held);
    if (!md.ok()) return fail(md.status());
    int64_t bad = 0, n = 0;
    std::string first;
    for (size_t i = 0; i < held.size(); ++i) {
      const TensorValues value(held[i].tensor);
      const float* buf = bufs[i].data();
      n += held[i].region.numel();
      for_each_element(shapes[i], held[i].region, [&](int64_t k, int64_t g) {
        if (buf[k] != value(g) && bad++ == 0) first = held[i].tensor + " element " + std::to_string(g);
      });
    }
    Status st = bad ? Status::Internal("rank " + std::to_string(world.rank()) + ": " + std::to_string(bad) + " of " +
                                       std::to_string(n) + " elements differ, first " + first)
                    : Status::Ok();
    st = world.agree(st);
    if (!st.ok()) return fail(st);
  } else {
    return fail(Status::InvalidArgument("mode save|load, got " + mode));
  }
  if (world.rank() == 0) std::printf("ok\n");
  return 0;
}
