// Calibration of this machine as a device type for the planner's cost model (docs/PLAN.md): the
// OpenBLAS sgemm FLOP/s at the trainer's shapes and thread count, the fraction of it the trainer's
// step reaches (efficiency), memory bandwidth, and the bandwidth and latency between MPI ranks.
// `ckpt plan --calibrate` writes the result as a cluster-file device type. Measurements run under
// the environment as it is (OPENBLAS_CORETYPE included, /work/shared/LIMITS.md).
#pragma once

#include <string>

#include "formats/base/status.h"
#include "reshard/dist/cluster.h"
#include "trainer/plan/calibrate_probe.h"
#include "trainer/plan/cost_model.h"

namespace ckpt::trainer {

struct CalibrateOptions {
  std::string name = "this-machine";  // device type name to write
  int threads = 1;                    // OpenBLAS threads per rank, as `ckpt train --threads`
  double seconds = 2.0;               // time budget per measurement
  bool mpi = true;                    // measure rank-to-rank bandwidth (spawns mpirun -np 2)
  std::string exe;                    // the ckpt binary mpirun starts (hidden command
                                      // calibrate-mpi-probe); empty: /proc/self/exe
};

struct Calibration {
  DeviceType device;            // peak_flops = measured sgemm FLOP/s; memory = physical RAM;
                                // link bandwidth = measured MPI bandwidth
  double efficiency = 0;        // trainer step FLOP/s without its optimizer update / sgemm FLOP/s on a small reference model
  double trainer_flops = 0;     // the trainer's whole step (update included): model FLOPs / seconds
  double memcpy_bytes_per_s = 0;
  double mpi_latency_s = 0;
  // The measured cost terms (with mpi; docs/PLAN.md "Calibrated terms"): concurrency [1,
  // sgemm_concurrent / sgemm_alone]; the all-reduce fit; micro_batch_overhead_s = the replicas'
  // slope; p2p_latency_s = the pipeline's slope - the replicas' slope.
  CostCalibration terms;
  ProbeCostTerms probe;
  // {"device_type": {...}, "efficiency":..., "measured": {...}, "cost_terms": {..., "measured": {...}}}
  nlohmann::json to_json() const;
};

Result<Calibration> calibrate_device(const CalibrateOptions& options);

}  // namespace ckpt::trainer
