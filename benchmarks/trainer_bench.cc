// trainer_bench: throughput of the reference trainer against OpenBLAS sgemm measured in the
// same run, 1 vs 2 OpenBLAS threads, and the time the training loop is blocked by an
// asynchronous checkpoint save versus a synchronous save of the same checkpoint.
//   trainer_bench [--steps N] [--hidden D] [--layers L] [--seq T] [--micro-batch B] [--out DIR] [--save-only]
// --save-only: the checkpoint part alone (benchmarks/io_floor_bench.py's trainer part).
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

#include "formats/base/fs_util.h"
#include "trainer/model/ops.h"
#include "trainer/train_loop.h"

using namespace ckpt;
using namespace ckpt::trainer;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// GFLOP/s of one n x n x n sgemm on buffers the caller keeps warm.
double sgemm_once(int64_t n, const std::vector<float>& a, const std::vector<float>& b, std::vector<float>& c) {
  const double t0 = now_s();
  gemm<float>(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
  return 2.0 * static_cast<double>(n) * n * n / (now_s() - t0) / 1e9;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t k = v.size() / 2;
  return v.size() % 2 ? v[k] : 0.5 * (v[k - 1] + v[k]);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t steps = 5, hidden = 512, layers = 4, seq = 256, mb = 4;
  std::string out = "/tmp/trainer_bench_run";
  bool save_only = false;
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--save-only") {  // no value: skip the throughput rounds, time the checkpoint save only
      save_only = true;
      --i;
      continue;
    }
    if (i + 1 >= argc) { std::fprintf(stderr, "flag %s needs a value\n", k.c_str()); return 2; }
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

  // Throughput: each round times one sgemm 2048^3 and then one training step with the same
  // thread count, back to back, so a shared machine's load hits both alike; the ratio is taken
  // per round and its median reported (plus the medians of each side).
  const int64_t n = 2048;
  std::vector<float> ga(static_cast<size_t>(n * n), 0.5f), gb(ga.size(), 0.25f), gc(ga.size(), 0.f);
  for (int threads : {1, 2}) {
    if (save_only) break;
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
    set_blas_threads(threads);
    (void)sgemm_once(n, ga, gb, gc);  // warm-up
    if (!(*t)->train_step().ok()) return 1;  // warm-up (first touch of activation buffers)
    std::vector<double> peaks, tps, fps, ratios;
    for (int64_t s = 0; s < steps; ++s) {
      const double peak = sgemm_once(n, ga, gb, gc);
      auto st = (*t)->train_step();
      if (!st.ok()) return 1;
      peaks.push_back(peak);
      tps.push_back(st->tokens_per_s);
      fps.push_back(st->flops_per_s / 1e9);
      ratios.push_back(st->flops_per_s / 1e9 / peak);
    }
    const double peak = median(peaks), tok = median(tps), fl = median(fps), ratio = median(ratios);
    std::printf("threads %d: sgemm 2048^3 %.1f GFLOP/s | train %.0f tok/s, %.1f model GFLOP/s | "
                "model FLOP/s / sgemm = %.1f%% (median of %lld interleaved rounds; %lld params, %.1f MFLOP/token)\n",
                threads, peak, tok, fl, 100 * ratio, static_cast<long long>(steps),
                static_cast<long long>((*t)->model().num_params()),
                (*t)->model().train_flops_per_token(seq) / 1e6);
    std::fflush(stdout);
    report["threads_" + std::to_string(threads)] = {{"sgemm_gflops", peak}, {"tokens_per_s", tok},
                                                     {"model_gflops", fl}, {"fraction_of_sgemm", ratio},
                                                     {"rounds", steps}};
  }

  // Checkpoint: the time the training loop is blocked by an asynchronous save (wait for the
  // previous save + snapshot copy into the staging buffer) vs a synchronous save (snapshot +
  // write + fsync + rename) of the same state, 3 rounds each, alternating; and the time of the
  // training step that overlaps the background write vs a step without one.
  {
    (void)remove_tree(out);
    TrainOptions o;
    o.config = c;
    o.steps = 1000;
    o.micro_batch = mb;
    o.seq_len = seq;
    o.threads = 1;
    o.print = false;
    o.out_dir = out;
    auto t = Trainer::create(o);
    if (!t.ok()) {
      std::fprintf(stderr, "%s\n", t.status().to_string().c_str());
      return 1;
    }
    std::vector<double> sync_b, async_b, plain_step, overlap_step, async_total;
    for (int r = 0; r < 3; ++r) {
      auto st0 = (*t)->train_step();
      if (!st0.ok()) return 1;
      plain_step.push_back(st0->seconds);
      auto sync = (*t)->save(false);
      if (!sync.ok()) { std::fprintf(stderr, "%s\n", sync.status().to_string().c_str()); return 1; }
      sync_b.push_back(*sync);
      if (!(*t)->train_step().ok()) return 1;
      const double t0 = now_s();
      auto blocked = (*t)->save(true);
      if (!blocked.ok()) return 1;
      auto st = (*t)->train_step();  // overlaps the background write
      if (!st.ok()) return 1;
      if (!(*t)->wait_saves().ok()) return 1;
      async_b.push_back(*blocked);
      overlap_step.push_back(st->seconds);
      async_total.push_back(now_s() - t0);
    }
    const double bytes = 3.0 * 4.0 * static_cast<double>((*t)->model().num_params());
    // The write itself (to compare with the disk's floor, `dd oflag=direct`): a synchronous save less
    // its snapshot copy (what an asynchronous one blocks for).
    const double write_s = std::max(1e-9, median(sync_b) - median(async_b));
    std::printf("checkpoint %.1f MB (weights + 2 Adam moments, fp32): synchronous save blocks the loop %.1f ms; "
                "async save blocks %.1f ms (snapshot copy) = %.1f%% of it; the step overlapping the background write "
                "takes %.1f ms vs %.1f ms without (medians of 3; page cache warm, memory hot)\n",
                bytes / 1e6, median(sync_b) * 1e3, median(async_b) * 1e3, 100 * median(async_b) / median(sync_b),
                median(overlap_step) * 1e3, median(plain_step) * 1e3);
    std::printf("the save's write (synchronous save less its snapshot copy): %.3f s, %.2f GB/s\n", write_s, bytes / write_s / 1e9);
    report["save"] = {{"bytes", bytes}, {"sync_blocked_s", median(sync_b)}, {"async_blocked_s", median(async_b)},
                      {"async_total_s", median(async_total)}, {"overlap_step_s", median(overlap_step)},
                      {"plain_step_s", median(plain_step)}, {"write_s", write_s}, {"write_gb_s", bytes / write_s / 1e9}};
    (void)remove_tree(out);
  }
  std::printf("%s\n", report.dump().c_str());
  return 0;
}
