// Throughput of the hot casts (bf16 <-> f32, f16 <-> f32) over 64 Mi elements (256 MiB of f32),
// single thread, next to a memcpy of the same f32 buffer in the same run. Reported rate
// (bytes_per_second) counts bytes read + written, for the casts and the memcpy alike, so the
// ratio cast/memcpy says how close a cast is to memory bandwidth.
// State: 'hot' (buffers allocated and touched once before the first benchmark, then reused);
// data: normal(0, 0.02) weights, i.e. no NaN/overflow (the flagged slow path is not exercised).
// Also runs the portable kernels (no AVX2/F16C) for comparison.
//   cast_bench [--benchmark_repetitions=3]
#include <benchmark/benchmark.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "formats/dtype/dtype.h"

namespace {

constexpr size_t kN = size_t{64} << 20;  // elements

struct Buffers {
  std::unique_ptr<float[]> f32_src, f32_dst;  // [kN]
  std::unique_ptr<uint16_t[]> b16;            // [kN] bf16 or f16 bits
  Buffers() : f32_src(new float[kN]), f32_dst(new float[kN]), b16(new uint16_t[kN]) {
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.f, 0.02f);
    for (size_t i = 0; i < 4096; ++i) f32_src[i] = nd(rng);
    for (size_t i = 4096; i < kN; ++i) f32_src[i] = f32_src[i % 4096] * (1.0f + static_cast<float>(i & 255) * 1e-3f);
    std::memset(f32_dst.get(), 0, kN * 4);
    std::memset(b16.get(), 0, kN * 2);
  }
};
Buffers& bufs() {
  static Buffers b;
  return b;
}

void BM_memcpy(benchmark::State& st) {
  auto& b = bufs();
  for (auto _ : st) {
    std::memcpy(b.f32_dst.get(), b.f32_src.get(), kN * 4);
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations() * kN * 8));
}

void run_cast(benchmark::State& st, ckpt::DType from, ckpt::DType to) {
  auto& b = bufs();
  ckpt::set_cast_portable_only(st.range(0) != 0);
  const void* src = from == ckpt::DType::kF32 ? static_cast<const void*>(b.f32_src.get()) : b.b16.get();
  void* dst = to == ckpt::DType::kF32 ? static_cast<void*>(b.f32_dst.get()) : b.b16.get();
  if (from != ckpt::DType::kF32) {  // valid 16-bit input
    (void)ckpt::cast_elements(b.f32_src.get(), ckpt::DType::kF32, b.b16.get(), from, kN);
  }
  for (auto _ : st) {
    ckpt::Status s = ckpt::cast_elements(src, from, dst, to, kN);
    if (!s.ok()) { st.SkipWithError(s.to_string().c_str()); break; }
    benchmark::ClobberMemory();
  }
  ckpt::set_cast_portable_only(false);
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations() * kN * 6));
  st.SetLabel(st.range(0) ? "portable" : "isa");
}

void BM_bf16_to_f32(benchmark::State& st) { run_cast(st, ckpt::DType::kBF16, ckpt::DType::kF32); }
void BM_f32_to_bf16(benchmark::State& st) { run_cast(st, ckpt::DType::kF32, ckpt::DType::kBF16); }
void BM_f16_to_f32(benchmark::State& st) { run_cast(st, ckpt::DType::kF16, ckpt::DType::kF32); }
void BM_f32_to_f16(benchmark::State& st) { run_cast(st, ckpt::DType::kF32, ckpt::DType::kF16); }

BENCHMARK(BM_memcpy)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_bf16_to_f32)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_f32_to_bf16)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_f16_to_f32)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_f32_to_f16)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
