#include "trainer/emulate.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "trainer/memory_estimate.h"

namespace ckpt::trainer {

std::string Emulation::label() const {
  if (!on) return "";
  std::string s = "emulated:";
  char buf[64];
  for (size_t i = 0; i < type_factors.size(); ++i) {
    std::snprintf(buf, sizeof buf, " x%.2f", type_factors[i].second);
    s += (i ? ", " : " ") + type_factors[i].first + buf;
  }
  return s + " (compute stretched to each device type's speed)";
}

nlohmann::json Emulation::factors_json() const {
  if (!on) return nullptr;
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, f] : type_factors) j[name] = f;
  return j;
}

double effective_flops(const DeviceType& d) { return d.peak_flops * Cluster::efficiency_of(d); }

Result<Emulation> make_emulation(const std::string& cluster_file, int world_size) {
  if (cluster_file.empty())
    return Status::Error("EmulationRefused", "--emulate needs --cluster FILE: the device types whose speeds the ranks emulate");
  Emulation e;
  CKPT_ASSIGN_OR_RETURN(e.cluster, Cluster::from_file(cluster_file));
  if (e.cluster.world_size() != world_size)
    return Status::Error("ClusterMismatch", "cluster file '" + cluster_file + "' has " +
                                                std::to_string(e.cluster.world_size()) + " ranks, the run has " +
                                                std::to_string(world_size))
        .with_file(cluster_file);
  std::vector<bool> used(e.cluster.types.size(), false);
  for (int t : e.cluster.rank_type) used[static_cast<size_t>(t)] = true;
  double fastest = 0;
  for (size_t t = 0; t < used.size(); ++t) {
    if (!used[t]) continue;
    const DeviceType& d = e.cluster.types[t];
    if (!(effective_flops(d) > 0))
      return Status::Error("EmulationRefused", "--emulate: device type '" + d.name +
                                                   "' has no peak_flops (> 0 expected, got " +
                                                   std::to_string(d.peak_flops) + "): its speed is unknown")
          .with_file(cluster_file);
    fastest = std::max(fastest, effective_flops(d));
  }
  for (size_t t = 0; t < used.size(); ++t)
    if (used[t]) e.type_factors.emplace_back(e.cluster.types[t].name, fastest / effective_flops(e.cluster.types[t]));
  for (int r = 0; r < world_size; ++r) e.rank_factor.push_back(fastest / effective_flops(e.cluster.device_of(r)));
  e.on = true;
  return e;
}

Result<nlohmann::json> emulation_memory_report(Comm& world, const Emulation& e, bool print) {
  std::vector<double> rss(static_cast<size_t>(world.size()), 0.0);
  rss[static_cast<size_t>(world.rank())] = static_cast<double>(peak_rss_bytes());
  CKPT_RETURN_IF_ERROR(world.all_reduce_max(rss.data(), static_cast<int64_t>(rss.size())));
  nlohmann::json out = nlohmann::json::array();
  if (world.rank() != 0) return out;
  for (int r = 0; r < world.size() && r < e.cluster.world_size(); ++r) {
    const DeviceType& d = e.cluster.device_of(r);
    const double mem = static_cast<double>(d.memory_bytes), peak = rss[static_cast<size_t>(r)];
    out.push_back({{"rank", r}, {"device", d.name}, {"peak_rss", static_cast<uint64_t>(peak)},
                   {"memory", d.memory_bytes}, {"fits", peak <= mem}});
    if (print)
      std::printf("emulation memory: rank %d (%s): peak RSS %.1f MiB of %.1f MiB, %s\n", r, d.name.c_str(),
                  peak / 1048576.0, mem / 1048576.0, peak <= mem ? "fits" : "EXCEEDS the device type's memory");
  }
  std::fflush(stdout);
  return out;
}

double emulate_sleep(double seconds, double factor) {
  if (!(factor > 1) || !(seconds > 0)) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds * (factor - 1)));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace ckpt::trainer
