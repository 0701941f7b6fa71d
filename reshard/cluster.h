// Cluster file (JSON): the device types of a cluster and how many ranks of each, in rank order.
//   {"device_types": [{"name": "A", "vendor": "vendor-a", "memory": "24GiB",
//                      "peak_flops": 1.2e14, "link_bandwidth": "100GB/s", "dtype": "bf16"}, ...],
//    "ranks": [{"type": "A", "count": 2}, {"type": "B", "count": 4}]}
// memory and link_bandwidth take a byte count or a size string (formats/byte_size.h: "24GiB",
// "500MB"; bandwidth in bytes per second, "/s" optional); peak_flops is FLOP/s; dtype is the stored
// dtype that device type's stack prefers ("bf16", "fp16", "fp32"). Unknown keys are refused.
// check_cluster_layout ties a cluster to a Layout: the rank counts add up to the layout's world
// size, and where a layout stage names a device type, every rank of that stage is of that type.
// Pure functions over values; thread safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/status.h"
#include "reshard/layout.h"

namespace ckpt {

struct DeviceType {
  std::string name;
  std::string vendor;
  uint64_t memory_bytes = 0;
  double peak_flops = 0;            // FLOP/s
  double link_bytes_per_s = 0;
  std::string dtype = "bf16";       // "bf16" | "fp16" | "fp32"
};

struct Cluster {
  std::vector<DeviceType> types;
  std::vector<int> rank_type;       // per rank (rank order): index into types

  int world_size() const { return static_cast<int>(rank_type.size()); }
  const DeviceType& device_of(int rank) const { return types.at(static_cast<size_t>(rank_type.at(static_cast<size_t>(rank)))); }

  // Errors: BadCluster naming the key / entry and what was expected (unknown key, unknown type,
  // a count < 1, duplicate type names, memory 0, sizes that do not parse).
  static Result<Cluster> from_json(const nlohmann::json& j);
  // read_json_file (bounded) then from_json; errors carry the file.
  static Result<Cluster> from_file(const std::string& path);
  nlohmann::json to_json() const;
};

// Errors: ClusterMismatch naming the rank, its (pipeline, stage, tp rank), the layout's device
// type and the cluster's, or the two world sizes.
Status check_cluster_layout(const Cluster& cluster, const Layout& layout);

}  // namespace ckpt
