// `ckpt train --emulate`: a heterogeneous cluster emulated on one machine. Every rank's compute is
// stretched by its device type's effective speed (peak_flops x efficiency, reshard/dist/cluster.h)
// relative to the fastest type among the ranks: after each timed compute section of the step
// (the forward or backward of a micro-batch, the optimizer update; TP all-reduces excluded) the
// rank sleeps t x (factor - 1), factor = fastest speed / own speed >= 1. Sleeping frees the core,
// so ranks oversubscribing the machine stay fair to each other. The numbers are unchanged (only
// sleeps are added). Memory: the cluster file's check before training (trainer/memory_report.h)
// caps every rank's estimate at its device type's memory; at the end every rank's peak RSS is
// reported against it. Every output labels the run as emulated with the per-type factors.
// Pure functions except emulate_sleep (thread safe) and emulation_memory_report (main thread).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/base/status.h"
#include "reshard/dist/cluster.h"
#include "reshard/dist/comm.h"

namespace ckpt::trainer {

struct Emulation {
  bool on = false;
  Cluster cluster;
  std::vector<std::pair<std::string, double>> type_factors;  // device types the ranks use, file order
  std::vector<double> rank_factor;                           // per rank

  double factor(int rank) const { return on ? rank_factor.at(static_cast<size_t>(rank)) : 1.0; }
  // "emulated: A x1.00, B x2.00 (compute stretched to each device type's speed)"; "" when off.
  std::string label() const;
  // {"A": 1.0, "B": 2.0}; null when off.
  nlohmann::json factors_json() const;
};

// A device type's effective training FLOP/s: peak_flops x Cluster::efficiency_of (the cost model's).
double effective_flops(const DeviceType& d);

// The emulation of `cluster_file` for a world of `world_size` ranks. Errors: EmulationRefused
// (no cluster file, a device type the ranks use without peak_flops > 0), the cluster's own
// (BadCluster), a rank count that differs from the world (ClusterMismatch).
Result<Emulation> make_emulation(const std::string& cluster_file, int world_size);

// Collective over `world` (the run's ranks, the cluster's rank order): every rank's peak RSS
// against its device type's memory. Rank 0 prints one line per rank when `print` ("emulation
// memory: rank 1 (B): peak RSS 41.2 MiB of 32768.0 MiB, fits") and returns
// [{"rank", "device", "peak_rss", "memory", "fits"}]; other ranks return an empty array.
Result<nlohmann::json> emulation_memory_report(Comm& world, const Emulation& e, bool print);

// Sleeps seconds x (factor - 1) (nothing when factor <= 1); returns the seconds slept.
double emulate_sleep(double seconds, double factor);

}  // namespace ckpt::trainer
