#include "reshard/cluster.h"

#include <cmath>
#include <limits>

#include "formats/byte_size.h"
#include "formats/json_read.h"

namespace ckpt {

namespace {

Status bad_cluster(const std::string& msg) { return Status::Error("BadCluster", msg); }

constexpr size_t kMaxTypes = 4096;
constexpr int64_t kMaxRanks = int64_t{1} << 20;

Status cluster_keys(const nlohmann::json& j, std::initializer_list<const char*> keys, const std::string& ctx) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool ok = false;
    for (const char* k : keys) ok = ok || it.key() == k;
    if (!ok) {
      std::string list;
      for (const char* k : keys) list += (list.empty() ? "" : ", ") + std::string(k);
      return bad_cluster(ctx + " has an unknown key '" + it.key() + "' (expected: " + list + ")");
    }
  }
  return Status::Ok();
}

// A byte count: a non-negative integer or a size string ("24GiB"; for bandwidths "100GB/s").
Result<uint64_t> bytes_field(const nlohmann::json& v, const std::string& ctx, bool per_second) {
  if (v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0)) return v.get<uint64_t>();
  if (v.is_string()) {
    std::string s = v.get<std::string>();
    if (per_second && s.size() > 2 && s.compare(s.size() - 2, 2, "/s") == 0) s.resize(s.size() - 2);
    auto r = parse_byte_size(s, ctx);
    if (!r.ok()) return bad_cluster(ctx + ": " + r.status().message());
    return *r;
  }
  return bad_cluster(ctx + " must be a byte count or a size string such as \"24GiB\"" +
             std::string(per_second ? " or \"100GB/s\"" : "") + ", got " + v.dump());
}

Result<DeviceType> device_type_from_json(const nlohmann::json& e, size_t i) {
  const std::string ctx = "cluster device_types[" + std::to_string(i) + "]";
  if (!e.is_object()) return bad_cluster(ctx + " must be an object {\"name\", \"memory\", ...}, got " + e.dump());
  CKPT_RETURN_IF_ERROR(cluster_keys(e, {"name", "vendor", "memory", "peak_flops", "link_bandwidth", "dtype"}, ctx));
  DeviceType d;
  auto name = e.find("name");
  if (name == e.end() || !name->is_string() || name->get<std::string>().empty() || name->get<std::string>().size() > 256)
    return bad_cluster(ctx + " needs a non-empty string 'name' (at most 256 bytes)");
  d.name = name->get<std::string>();
  const std::string tctx = "cluster device type '" + d.name + "'";
  if (auto v = e.find("vendor"); v != e.end()) {
    if (!v->is_string()) return bad_cluster(tctx + " key 'vendor' must be a string, got " + v->dump());
    d.vendor = v->get<std::string>();
  }
  auto mem = e.find("memory");
  if (mem == e.end()) return bad_cluster(tctx + " is missing key 'memory' (bytes or a size string such as \"24GiB\")");
  CKPT_ASSIGN_OR_RETURN(d.memory_bytes, bytes_field(*mem, tctx + " key 'memory'", false));
  if (d.memory_bytes == 0) return bad_cluster(tctx + " key 'memory' must be > 0");
  if (auto v = e.find("peak_flops"); v != e.end()) {
    if (!v->is_number() || !std::isfinite(v->get<double>()) || v->get<double>() < 0)
      return bad_cluster(tctx + " key 'peak_flops' must be a number >= 0 (FLOP/s), got " + v->dump());
    d.peak_flops = v->get<double>();
  }
  if (auto v = e.find("link_bandwidth"); v != e.end()) {
    CKPT_ASSIGN_OR_RETURN(uint64_t bw, bytes_field(*v, tctx + " key 'link_bandwidth'", true));
    d.link_bytes_per_s = static_cast<double>(bw);
  }
  if (auto v = e.find("dtype"); v != e.end()) {
    if (!v->is_string() || (*v != "bf16" && *v != "fp16" && *v != "fp32"))
      return bad_cluster(tctx + " key 'dtype' must be \"bf16\", \"fp16\" or \"fp32\", got " + v->dump());
    d.dtype = v->get<std::string>();
  }
  return d;
}

Status ranks_from_json(const nlohmann::json& rj, Cluster& c) {
  if (!rj.is_array() || rj.empty())
    return bad_cluster("cluster key 'ranks' must be a non-empty array of {\"type\": NAME, \"count\": N}");
  int64_t total = 0;
  for (size_t i = 0; i < rj.size(); ++i) {
    const std::string ctx = "cluster ranks[" + std::to_string(i) + "]";
    const nlohmann::json& e = rj[i];
    if (!e.is_object()) return bad_cluster(ctx + " must be an object {\"type\": NAME, \"count\": N}, got " + e.dump());
    CKPT_RETURN_IF_ERROR(cluster_keys(e, {"type", "count"}, ctx));
    auto t = e.find("type");
    if (t == e.end() || !t->is_string()) return bad_cluster(ctx + " needs a string 'type' (a device_types name)");
    int type = -1;
    for (size_t k = 0; k < c.types.size(); ++k)
      if (c.types[k].name == t->get<std::string>()) type = static_cast<int>(k);
    if (type < 0) return bad_cluster(ctx + " names device type " + t->dump() + ", which device_types does not define");
    auto n = e.find("count");
    if (n == e.end() || !n->is_number_integer() || n->get<int64_t>() < 1 || n->get<int64_t>() > kMaxRanks)
      return bad_cluster(ctx + " needs an integer 'count' in 1.." + std::to_string(kMaxRanks) +
                 (n == e.end() ? std::string(", got none") : ", got " + n->dump()));
    total += n->get<int64_t>();
    if (total > kMaxRanks) return bad_cluster("cluster has more than " + std::to_string(kMaxRanks) + " ranks");
    c.rank_type.insert(c.rank_type.end(), static_cast<size_t>(n->get<int64_t>()), type);
  }
  return Status::Ok();
}

std::string place_text(const Layout& l, int rank) {
  const RankPlace p = l.place_of_rank(rank);
  return "rank " + std::to_string(rank) + " (pipeline " + std::to_string(p.pipeline) + ", stage " +
         std::to_string(p.stage) + ", tp rank " + std::to_string(p.tp_rank) + ")";
}

}  // namespace

Result<Cluster> Cluster::from_json(const nlohmann::json& j) {
  if (!j.is_object()) return bad_cluster("cluster must be a JSON object {\"device_types\": [...], \"ranks\": [...]}");
  CKPT_RETURN_IF_ERROR(cluster_keys(j, {"device_types", "ranks"}, "cluster"));
  auto dt = j.find("device_types");
  if (dt == j.end() || !dt->is_array() || dt->empty())
    return bad_cluster("cluster key 'device_types' must be a non-empty array of device types");
  if (dt->size() > kMaxTypes) return bad_cluster("cluster key 'device_types' has more than " + std::to_string(kMaxTypes) + " entries");
  Cluster c;
  for (size_t i = 0; i < dt->size(); ++i) {
    CKPT_ASSIGN_OR_RETURN(DeviceType d, device_type_from_json((*dt)[i], i));
    for (const DeviceType& o : c.types)
      if (o.name == d.name) return bad_cluster("cluster device type '" + d.name + "' is defined twice");
    c.types.push_back(std::move(d));
  }
  auto rj = j.find("ranks");
  if (rj == j.end()) return bad_cluster("cluster is missing key 'ranks' (the device type of every rank, in rank order)");
  CKPT_RETURN_IF_ERROR(ranks_from_json(*rj, c));
  return c;
}

Result<Cluster> Cluster::from_file(const std::string& path) {
  CKPT_ASSIGN_OR_RETURN(nlohmann::json j, read_json_file(path, kLayoutJsonLimits, "cluster file"));
  auto r = from_json(j);
  if (!r.ok()) return r.take_status().with_file(path);
  return r;
}

nlohmann::json Cluster::to_json() const {
  nlohmann::json types_j = nlohmann::json::array();
  for (const DeviceType& d : types)
    types_j.push_back({{"name", d.name},
                       {"vendor", d.vendor},
                       {"memory", d.memory_bytes},
                       {"peak_flops", d.peak_flops},
                       {"link_bandwidth", static_cast<uint64_t>(d.link_bytes_per_s)},
                       {"dtype", d.dtype}});
  nlohmann::json ranks_j = nlohmann::json::array();
  for (size_t r = 0; r < rank_type.size();) {
    size_t e = r;
    while (e < rank_type.size() && rank_type[e] == rank_type[r]) ++e;
    ranks_j.push_back({{"type", types[static_cast<size_t>(rank_type[r])].name}, {"count", e - r}});
    r = e;
  }
  return {{"device_types", types_j}, {"ranks", ranks_j}};
}

Status check_cluster_layout(const Cluster& cluster, const Layout& layout) {
  if (cluster.world_size() != layout.world_size())
    return Status::Error("ClusterMismatch", "the cluster file has " + std::to_string(cluster.world_size()) +
                                                " ranks, the layout " + layout.to_string() + " needs " +
                                                std::to_string(layout.world_size()));
  for (int r = 0; r < layout.world_size(); ++r) {
    const RankPlace p = layout.place_of_rank(r);
    const std::string want = layout.stage_device(p.pipeline, p.stage);
    const std::string& got = cluster.device_of(r).name;
    if (!want.empty() && want != got)
      return Status::Error("ClusterMismatch", place_text(layout, r) + " is on device type '" + want +
                                                  "' in the layout, but the cluster file puts a '" + got +
                                                  "' there (ranks are numbered stage by stage, then pipeline, "
                                                  "then tp rank)");
  }
  return Status::Ok();
}

}  // namespace ckpt
