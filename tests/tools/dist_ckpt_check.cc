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

float value(const std::string& name, int64_t e) {
  return static_cast<float>(init_value(7, name, static_cast<uint64_t>(e)) + 1e-4 * static_cast<double>(e % 4099));
}

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

// Global flat index of element k (storage order) of region r of a tensor of shape `shape`.
int64_t global_index(const Shape& shape, const Region& r, int64_t k) {
  const Box& b = r.box;
  int64_t rem = k + (r.is_flat() ? r.flat_begin : 0);
  std::vector<int64_t> idx(b.ndim());
  for (size_t d = b.ndim(); d-- > 0;) {
    idx[d] = rem % b.extent[d];
    rem /= b.extent[d];
  }
  int64_t g = 0;
  for (size_t d = 0; d < b.ndim(); ++d) g = g * shape[d] + (b.offset[d] + idx[d]);
  return g;
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
    for (size_t i = 0; i < held.size(); ++i)
      for (int64_t k = 0; k < held[i].region.numel(); ++k)
        bufs[i][static_cast<size_t>(k)] = value(held[i].tensor, global_index(shapes[i], held[i].region, k));
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
    for (size_t i = 0; i < held.size(); ++i)
      for (int64_t k = 0; k < held[i].region.numel(); ++k, ++n) {
        const int64_t g = global_index(shapes[i], held[i].region, k);
        if (bufs[i][static_cast<size_t>(k)] != value(held[i].tensor, g) && bad++ == 0)
          first = held[i].tensor + " element " + std::to_string(g);
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
