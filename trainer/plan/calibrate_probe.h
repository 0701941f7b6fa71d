// The measurements behind trainer/plan/calibrate.h, each a median of timed repetitions within a
// time budget:
// - sgemm_flops: OpenBLAS sgemm FLOP/s through the trainer's own linear_forward / linear_backward
//   (trainer/model/ops.h) at the GEMM shapes of one decoder layer of the calibration model
//   (calibration_model(): rows n = micro-batch x seq; [n, D] x [D, F] and back, forward 2nDF and
//   backward 4nDF FLOPs each), with `threads` OpenBLAS threads;
// - trainer_flops: the real trainer (Trainer::create + train_step, one process) on that model, its
//   model FLOP/s counted by the cost model's ModelSpec::step_flops (trainer/plan/cost_model.h; equal
//   to Model::train_flops_per_token x tokens);
// - memcpy_bandwidth: bytes/s of a memcpy of 64 MiB (buffers touched first);
// - update_params_rate: parameters per second of the trainer's optimizer update (optimizer_step:
//   the gradient norm, clipping, trainer/optim/adamw.h's AdamW) over one slot of 4M parameters;
// - mpi_probe: under mpirun -np 2, ping-pong between ranks 0 and 1 over reshard/dist/comm.h (the
//   trainer's Comm): latency = half the median round trip of an 8-byte message, bandwidth = bytes /
//   half the median round trip of a 16 MiB message (less the latency); rank 0 prints one JSON line {"latency_s", "bytes_per_s"};
//   spawn_mpi_probe runs it (mpirun -np 2 --oversubscribe --mca btl self,vader EXE
//   calibrate-mpi-probe, with a session directory of its own: see the .cc) and parses that line;
// - probe_cost_terms (same job, trainer/plan/calibrate_terms.cc; docs/PLAN.md "Calibrated terms"):
//   sgemm FLOP/s of rank 0 alone and of both ranks at once (concurrency); the all-reduce per call
//   between GEMMs ([rows, 256] x [256, 256] on both ranks, then all_reduce_sum of the [rows, 256]
//   result; per call = with - without the all-reduce) at rows 128 and 512, fitted as latency +
//   bytes / bandwidth; the expert all-to-all the same way (after the GEMM, the counts then the
//   [rows, 256] rows sent to the peer and its rows received, one Comm::exchange each, as the
//   trainer's EP dispatch); the step time of a tiny model (2 layers, hidden 32, seq 16, micro-batch 1)
//   with 2 and 16 micro-batches as 2 replicas and as a 2-stage pipeline: its slope per micro-batch;
//   the gradient sync: all_reduce_sum of 16 MiB (the size of a small model's gradients; the
//   per-call fit above is at 128-512 KiB), bytes / the median call (the ring at 2 ranks moves each
//   byte once each way).
// Thread safety: main thread only (OpenBLAS thread count, Comm).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "converters/model/llama_config.h"
#include "formats/base/status.h"

namespace ckpt::trainer {

// The small reference model calibration runs (6 layers, hidden 256, intermediate 704, 8 heads,
// 4 KV heads, head_dim 32, vocab 264) and its batch shape.
LlamaConfig calibration_model();
inline constexpr int64_t kCalibrationSeq = 128;
inline constexpr int64_t kCalibrationMicroBatch = 4;

double sgemm_flops(int threads, double seconds);
// Model FLOP/s of the trainer's step (first step excluded as warm-up).
Result<double> trainer_flops(int threads, double seconds);
double memcpy_bandwidth(double seconds);
double update_params_rate(double seconds);

struct ProbeCostTerms {
  double sgemm_alone = 0, sgemm_concurrent = 0;  // FLOP/s per process
  std::vector<double> allreduce_sizes_bytes, allreduce_call_s;
  double allreduce_latency_s = 0, allreduce_bytes_per_s = 0;
  std::vector<double> a2a_sizes_bytes, a2a_call_s;  // the expert all-to-all (Comm::exchange), as the all-reduce
  double a2a_latency_s = 0, a2a_bytes_per_s = 0;
  double dp_micro_batch_s = 0, pp_micro_batch_s = 0;  // step-time slope per micro-batch
  double sync_bytes_per_s = 0;                        // the 16 MiB all-reduce
  nlohmann::json to_json() const;
  static ProbeCostTerms from_json(const nlohmann::json& j);  // missing keys: 0
};
// Collective over Comm::world() (2 ranks).
Result<ProbeCostTerms> probe_cost_terms(int threads, double seconds);

struct MpiProbeResult {
  double latency_s = 0;
  double bytes_per_s = 0;
  ProbeCostTerms terms;
};
// Run by every rank of the mpirun job (hidden command `ckpt calibrate-mpi-probe`).
Status mpi_probe(double seconds, int threads = 1);
// exe: the ckpt binary (empty: /proc/self/exe).
Result<MpiProbeResult> spawn_mpi_probe(const std::string& exe, double seconds, int threads = 1);

}  // namespace ckpt::trainer
