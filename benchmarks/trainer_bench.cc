// trainer_bench: throughput of the reference trainer against OpenBLAS sgemm measured in the
// same run, 1 vs 2 OpenBLAS threads, and the time the training loop is blocked by an
// asynchronous checkpoint save versus a synchronous save of the same checkpoint.
//   trainer_bench [--steps N] [--hidden D] [--layers L] [--seq T] [--micro-batch B] [--out DIR]
// Prints one human line per measurement and a final JSON object. OPENBLAS_CORETYPE is left as
// the environment sets it (reported). Memory state: "hot" (buffers reused; a warm-up step runs
// before timing); page cache of the checkpoint dir: warm (written just before).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <sys/stat.h>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/store/fs_util.h"
#include "trainer/ops.h"
#include "trainer/train_loop.h"

using namespace ckpt;
using namespace ckpt::trainer;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Best-of-3 sgemm GFLOP/s of an n x n x n product.
double sgemm_gflops(int threads, int64_t n) {
  set_blas_threads(threads);
  std::vector<float> a(static_cast<size_t>(n * n), 0.5f), b(a.size(), 0.25f), c(a.size(), 0.f);
  gemm<float>(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);  // warm
  double best = 0;
  for (int r = 0; r < 3; ++r) {
    const double t0 = now_s();
    gemm<float>(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
    const double dt = now_s() - t0;
    best = std::max(best, 2.0 * n * n * n / dt / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t steps = 4, hidden = 512, layers = 4, seq = 256, mb = 4;
  std::string out = "/tmp/trainer_bench_run";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int64_t v = std::atoll(argv[i + 1]);
    if (k == "--steps") steps = v;
    else if (k == "--hidden") hidden = v;
    else if (k == "--layers") layers = v;
    else if (k == "--seq") seq = v;
    else if (k == "--micro-batch") mb = v;
    else if (k == "--out") out = argv[i + 1];
    else { std::fprintf(stderr, "unknown flag %s\n", k.c_str()); return 2; }
  }
  const char* core = std::getenv("OPENBLAS_CORETYPE");
  nlohmann::json report;
  report["openblas_coretype"] = core ? core : "(unset)";
  report["config"] = {{"hidden", hidden}, {"layers", layers}, {"seq", seq}, {"micro_batch", mb}};

  LlamaConfig c;
  c.vocab_size = 264;
  c.hidden_size = hidden;
  c.intermediate_size = (hidden * 8 / 3 + 63) / 64 * 64;
  c.num_hidden_layers = layers;
  c.num_attention_heads = std::max<int64_t>(1, hidden / 64);
  c.num_key_value_heads = std::max<int64_t>(1, c.num_attention_heads / 2);
  c.head_dim = 64;
  c.max_position_embeddings = std::max<int64_t>(seq, 512);

  for (int threads : {1, 2}) {
    const double peak = sgemm_gflops(threads, 2048);
    TrainOptions o;
    o.config = c;
    o.steps = steps + 1;
    o.micro_batch = mb;
    o.seq_len = seq;
    o.threads = threads;
    o.print = false;
    auto t = Trainer::create(o);
    if (!t.ok()) {
      std::fprintf(stderr, "%s\n", t.status().to_string().c_str());
      return 1;
    }
    std::vector<double> tps, fps;
    for (int64_t s = 0; s <= steps; ++s) {
      auto st = (*t)->train_step();
      if (!st.ok()) return 1;
      if (s == 0) continue;  // warm-up (first touch of activation buffers)
      tps.push_back(st->tokens_per_s);
      fps.push_back(st->flops_per_s);
    }
    std::sort(tps.begin(), tps.end());
    std::sort(fps.begin(), fps.end());
    const double tok = tps[tps.size() / 2], fl = fps[fps.size() / 2];
    std::printf("threads %d: sgemm 2048^3 %.1f GFLOP/s | train %.0f tok/s, %.1f model GFLOP/s = %.1f%% of sgemm (%lld params, median of %lld steps)\n",
                threads, peak, tok, fl / 1e9, 100 * fl / 1e9 / peak,
                static_cast<long long>((*t)->model().num_params()), static_cast<long long>(steps));
    report["threads_" + std::to_string(threads)] = {{"sgemm_gflops", peak}, {"tokens_per_s", tok},
                                                     {"model_gflops", fl / 1e9}, {"fraction_of_sgemm", fl / 1e9 / peak}};
  }

  // Checkpoint: blocked time of an async save vs a synchronous save of the same state.
  {
    (void)store::remove_tree(out);
    TrainOptions o;
    o.config = c;
    o.steps = 3;
    o.micro_batch = mb;
    o.seq_len = seq;
    o.threads = 1;
    o.print = false;
    o.out_dir = out;
    auto t = Trainer::create(o);
    if (!t.ok()) return 1;
    if (!(*t)->train_step().ok()) return 1;
    auto sync = (*t)->save(false);  // step 1, synchronous
    if (!sync.ok()) { std::fprintf(stderr, "%s\n", sync.status().to_string().c_str()); return 1; }
    if (!(*t)->train_step().ok()) return 1;
    const double t0 = now_s();
    auto blocked = (*t)->save(true);  // step 2, asynchronous
    if (!blocked.ok()) return 1;
    auto st = (*t)->train_step();     // overlaps the background write
    if (!st.ok()) return 1;
    if (!(*t)->wait_saves().ok()) return 1;
    const double total_async = now_s() - t0;
    const double bytes = 3.0 * 4.0 * static_cast<double>((*t)->model().num_params());
    std::printf("checkpoint %.1f MB: synchronous save blocks %.1f ms; async save blocks %.1f ms (snapshot copy), "
                "step + background write done after %.1f ms (step alone %.1f ms)\n",
                bytes / 1e6, *sync * 1e3, *blocked * 1e3, total_async * 1e3, st->seconds * 1e3);
    report["save"] = {{"bytes", bytes}, {"sync_blocked_s", *sync}, {"async_blocked_s", *blocked},
                      {"async_total_s", total_async}, {"step_s", st->seconds}};
    (void)store::remove_tree(out);
  }
  std::printf("%s\n", report.dump().c_str());
  return 0;
}
