// Cluster file (JSON): the device types of a cluster and how many ranks of each, in rank order.
//   {"device_types": [{"name": "A", "vendor": "vendor-a", "memory": "24GiB",
//                      "peak_flops": 1.2e14, "link_bandwidth": "100GB/s", "dtype": "bf16"}, ...],
//    "ranks": [{"type": "A", "count": 2}, {"type": "B", "count": 4}]}
// or, with topology (docs/CLUSTER.md "Topology"), nodes instead of ranks:
//    "nodes": [{"name": "n0", "devices": [{"type": "A", "count": 8}],
//               "intra_node": {"bandwidth": "300GB/s"}}, ...],
//    "links": {"intra_node": {"bandwidth": "200GB/s", "latency": "5us"},
//              "inter_node": {"bandwidth": "25GB/s", "latency": "20us"}}
// The ranks are then the nodes' devices in order. A file with only "ranks" is one node ("node0")
// holding every rank. A device type may give "efficiency": the fraction of peak_flops a training
// step reaches (default kDefaultEfficiency), used by the planner's cost model (docs/PLAN.md).
// memory and link_bandwidth take a byte count or a size string (formats/base/byte_size.h: "24GiB",
// "500MB"; bandwidth in bytes per second, "/s" optional); peak_flops is FLOP/s; dtype is the stored
// dtype that device type's stack prefers ("bf16", "fp16", "fp32"); profile names the storage
// convention (converters/profile/profile.h, docs/PROFILES.md) of that device type's stack, a built-in profile
// name checked where profiles are known (trainer/train_profile.h: `ckpt train` saves in it and
// converts a resume into it, docs/TRAINER.md "Profiles"). Unknown keys are refused.
// check_cluster_layout ties a cluster to a Layout: the rank counts add up to the layout's world
// size, and where a layout stage names a device type, every rank of that stage is of that type.
// Pure functions over values; thread safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/base/status.h"
#include "reshard/layout/layout.h"

namespace ckpt {

struct DeviceType {
  std::string name;
  std::string vendor;
  uint64_t memory_bytes = 0;
  double peak_flops = 0;            // FLOP/s
  double link_bytes_per_s = 0;
  std::string dtype = "bf16";       // "bf16" | "fp16" | "fp32"
  double efficiency = 0;            // fraction of peak_flops a training step reaches; 0: not given
                                    // (the cost model then uses kDefaultEfficiency)
  std::string profile;              // the stack's profile name ([a-z0-9._-]+); "": not given
};

inline constexpr double kDefaultEfficiency = 0.5;
inline constexpr double kDefaultLinkBytesPerS = 10e9;     // no link and no device link_bandwidth
inline constexpr double kDefaultIntraLatencyS = 5e-6;
inline constexpr double kDefaultInterLatencyS = 20e-6;

// A link class: bandwidth (bytes/s) and latency (s); 0 = not given (defaults apply).
struct LinkSpec {
  double bytes_per_s = 0;
  double latency_s = -1;  // < 0: not given
};

struct NodeSpec {
  std::string name;
  int first_rank = 0;
  int count = 0;
  LinkSpec intra;  // per-node override of the cluster's intra_node link (fields not given: cluster's)
};

struct Cluster {
  std::vector<DeviceType> types;
  std::vector<int> rank_type;       // per rank (rank order): index into types
  std::vector<NodeSpec> nodes;      // consecutive rank ranges; empty: one node with every rank
  std::vector<int> rank_node;       // per rank: index into nodes (empty with nodes)
  LinkSpec intra_node, inter_node;  // the "links" object
  bool topology = false;            // the file gave "nodes" (to_json writes them back)

  int world_size() const { return static_cast<int>(rank_type.size()); }
  int node_of(int rank) const { return rank_node.empty() ? 0 : rank_node.at(static_cast<size_t>(rank)); }
  int num_nodes() const { return nodes.empty() ? 1 : static_cast<int>(nodes.size()); }
  // The link between two ranks: intra_node (the node's override, else the cluster's) when they
  // share a node, else inter_node. A bandwidth not given is the lower link_bandwidth of the two
  // ranks' device types (kDefaultLinkBytesPerS when neither gives one); a latency not given is
  // kDefaultIntraLatencyS / kDefaultInterLatencyS.
  LinkSpec link(int a, int b) const;
  // The slowest link (lowest bandwidth, then highest latency) between any two of `ranks`; one rank:
  // its intra-node link.
  LinkSpec slowest_link(const std::vector<int>& ranks) const;
  // The device type's efficiency, or kDefaultEfficiency.
  static double efficiency_of(const DeviceType& d) { return d.efficiency > 0 ? d.efficiency : kDefaultEfficiency; }
  const DeviceType& device_of(int rank) const { return types.at(static_cast<size_t>(rank_type.at(static_cast<size_t>(rank)))); }

  // Errors: BadCluster naming the key / entry and what was expected (unknown key, unknown type,
  // a count < 1, duplicate type names, memory 0, sizes that do not parse, an empty node, a node
  // named twice, both "ranks" and "nodes" disagreeing, an efficiency outside (0, 1], a profile that
  // is not a string of [a-z0-9._-]+).
  static Result<Cluster> from_json(const nlohmann::json& j);
  // read_json_file (bounded) then from_json; errors carry the file.
  static Result<Cluster> from_file(const std::string& path);
  nlohmann::json to_json() const;
};

// Errors: ClusterMismatch naming the rank, its (pipeline, stage, tp rank), the layout's device
// type and the cluster's, or the two world sizes.
Status check_cluster_layout(const Cluster& cluster, const Layout& layout);

}  // namespace ckpt
