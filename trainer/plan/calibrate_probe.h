// The measurements behind trainer/plan/calibrate.h, each a median of timed repetitions within a
// time budget:
// - sgemm_flops: OpenBLAS sgemm FLOP/s through the trainer's own linear_forward / linear_backward
//   (trainer/ops.h) at the GEMM shapes of one decoder layer of the calibration model
//   (calibration_model(): rows n = micro-batch x seq; [n, D] x [D, F] and back, forward 2nDF and
//   backward 4nDF FLOPs each), with `threads` OpenBLAS threads;
// - trainer_flops: the real trainer (Trainer::create + train_step, one process) on that model, its
//   model FLOP/s counted by the cost model's ModelSpec::step_flops (trainer/plan/cost_model.h; equal
//   to Model::train_flops_per_token x tokens);
// - memcpy_bandwidth: bytes/s of a memcpy of 64 MiB (buffers touched first);
// - mpi_probe: under mpirun -np 2, ping-pong between ranks 0 and 1 over reshard/comm.h (the
//   trainer's Comm): latency = half the round trip of an 8-byte message, bandwidth = bytes / half
//   the round trip of a 16 MiB message; rank 0 prints one JSON line {"latency_s", "bytes_per_s"};
//   spawn_mpi_probe runs it (mpirun -np 2 --oversubscribe --mca btl self,vader EXE
//   calibrate-mpi-probe) and parses that line.
// Thread safety: main thread only (OpenBLAS thread count, Comm).
#pragma once

#include <cstdint>
#include <string>

#include "converters/llama_config.h"
#include "formats/status.h"

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

struct MpiProbeResult {
  double latency_s = 0;
  double bytes_per_s = 0;
};
// Run by every rank of the mpirun job (hidden command `ckpt calibrate-mpi-probe`).
Status mpi_probe(double seconds);
// exe: the ckpt binary (empty: /proc/self/exe).
Result<MpiProbeResult> spawn_mpi_probe(const std::string& exe, double seconds);

}  // namespace ckpt::trainer
