#include "trainer/plan/calibrate.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>

#include "trainer/plan/calibrate_probe.h"

namespace ckpt::trainer {

namespace {

uint64_t calib_physical_memory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

nlohmann::json calib_device_json(const DeviceType& d) {
  return {{"name", d.name},
          {"vendor", d.vendor},
          {"memory", d.memory_bytes},
          {"peak_flops", d.peak_flops},
          {"link_bandwidth", static_cast<uint64_t>(d.link_bytes_per_s)},
          {"dtype", d.dtype}};
}

// docs/PLAN.md "Calibrated terms": each a measured figure of the probe, unchanged but for clamping.
CostCalibration calib_terms_from_probe(const ProbeCostTerms& p) {
  CostCalibration t;
  t.concurrency.push_back(1.0);
  if (p.sgemm_alone > 0 && p.sgemm_concurrent > 0) t.concurrency.push_back(std::clamp(p.sgemm_concurrent / p.sgemm_alone, 1e-3, 1.0));
  t.allreduce_latency_s = p.allreduce_latency_s;
  t.allreduce_bytes_per_s = p.allreduce_bytes_per_s;
  t.a2a_latency_s = p.a2a_latency_s;
  t.a2a_bytes_per_s = p.a2a_bytes_per_s;
  t.micro_batch_overhead_s = p.dp_micro_batch_s;
  t.p2p_latency_s = std::max(0.0, p.pp_micro_batch_s - p.dp_micro_batch_s);
  t.sync_bytes_per_s = p.sync_bytes_per_s;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) t.cores = CPU_COUNT(&set);
  return t;
}

}  // namespace

nlohmann::json Calibration::to_json() const {
  nlohmann::json dev = calib_device_json(device);
  dev["efficiency"] = device.efficiency;
  nlohmann::json terms_json = terms.to_json();
  terms_json["measured"] = probe.to_json();
  return {{"device_type", dev},
          {"cost_terms", terms_json},
          {"efficiency", efficiency},
          {"measured",
           {{"sgemm_flops", device.peak_flops},
            {"trainer_flops", trainer_flops},
            {"memcpy_bytes_per_s", memcpy_bytes_per_s},
            {"mpi_bytes_per_s", device.link_bytes_per_s},
            {"mpi_latency_s", mpi_latency_s}}}};
}

Result<Calibration> calibrate_device(const CalibrateOptions& o) {
  if (o.threads < 1 || o.threads > 1024) return Status::InvalidArgument("calibration: --threads must be in [1, 1024]");
  if (!(o.seconds > 0) || o.seconds > 600)
    return Status::InvalidArgument("calibration: the time per measurement must be in (0, 600] seconds");
  if (o.name.empty()) return Status::InvalidArgument("calibration: the device type needs a name");
  Calibration c;
  c.device.name = o.name;
  c.device.vendor = "cpu";
  c.device.dtype = "fp32";
  c.device.memory_bytes = calib_physical_memory();
  c.device.peak_flops = sgemm_flops(o.threads, o.seconds);
  CKPT_ASSIGN_OR_RETURN(double trainer, trainer_flops(o.threads, o.seconds));
  c.trainer_flops = trainer;
  // The optimizer update is a term of its own (update_params_per_s): the efficiency is the step's
  // FLOPs over its time without the calibration model's update.
  const double ups = update_params_rate(std::min(o.seconds, 1.0));
  const ModelSpec cm = ModelSpec::from_config(calibration_model());
  const double flops = cm.step_flops(kCalibrationMicroBatch, kCalibrationSeq), step_s = trainer > 0 ? flops / trainer : 0;
  const double update_s = ups > 0 ? static_cast<double>(cm.total_params()) / ups : 0;
  if (step_s > 2 * update_s) trainer = flops / (step_s - update_s);
  c.efficiency = c.device.peak_flops > 0 ? trainer / c.device.peak_flops : 0;
  // A cluster file takes an efficiency in (0, 1]; a noisy measurement above 1 is written as 1.
  c.device.efficiency = std::clamp(c.efficiency, 1e-6, 1.0);
  c.memcpy_bytes_per_s = memcpy_bandwidth(std::min(o.seconds, 1.0));
  if (o.mpi) {
    CKPT_ASSIGN_OR_RETURN(MpiProbeResult m, spawn_mpi_probe(o.exe, std::min(o.seconds, 2.0), o.threads));
    c.device.link_bytes_per_s = m.bytes_per_s;
    c.mpi_latency_s = m.latency_s;
    c.probe = m.terms;
    c.terms = calib_terms_from_probe(m.terms);
  } else {
    c.device.link_bytes_per_s = c.memcpy_bytes_per_s;  // no MPI measurement: the memory copy bounds it
  }
  if (step_s > 2 * update_s) c.terms.update_params_per_s = ups;
  return c;
}

}  // namespace ckpt::trainer
