#include "reshard/dist/cluster.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "formats/base/byte_size.h"
#include "formats/base/json_read.h"

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
  CKPT_RETURN_IF_ERROR(cluster_keys(e, {"name", "vendor", "memory", "peak_flops", "link_bandwidth", "dtype", "efficiency", "profile"}, ctx));
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
  if (auto v = e.find("efficiency"); v != e.end()) {
    if (!v->is_number() || !(v->get<double>() > 0) || v->get<double>() > 1)
      return bad_cluster(tctx + " key 'efficiency' must be a number in (0, 1] (the fraction of peak_flops a "
                         "training step reaches), got " + v->dump());
    d.efficiency = v->get<double>();
  }
  if (auto v = e.find("profile"); v != e.end()) {
    const bool ok = v->is_string() && !v->get<std::string>().empty() && v->get<std::string>().size() <= 128 &&
                    std::all_of(v->get_ref<const std::string&>().begin(), v->get_ref<const std::string&>().end(),
                                [](char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-'; });
    if (!ok)
      return bad_cluster(tctx + " key 'profile' must be a profile name such as \"megatron-mcore\" (a-z, 0-9, '.', '_', '-'), got " +
                         v->dump());
    d.profile = v->get<std::string>();
  }
  return d;
}

Status ranks_from_json(const nlohmann::json& rj, Cluster& c, const std::string& where = "cluster key 'ranks'",
                       const std::string& item = "cluster ranks") {
  if (!rj.is_array() || rj.empty())
    return bad_cluster(where + " must be a non-empty array of {\"type\": NAME, \"count\": N}" +
                       (rj.is_array() ? std::string(" (an empty node has no devices)") : std::string()));
  int64_t total = static_cast<int64_t>(c.rank_type.size());
  for (size_t i = 0; i < rj.size(); ++i) {
    const std::string ctx = item + "[" + std::to_string(i) + "]";
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


// A latency: seconds as a number, or a string with a unit ("5us", "0.02ms", "1e-6s", "800ns").
Result<double> cluster_latency_field(const nlohmann::json& v, const std::string& ctx) {
  double sec = -1;
  if (v.is_number()) {
    sec = v.get<double>();
  } else if (v.is_string()) {
    const std::string s = v.get<std::string>();
    size_t pos = 0;
    double x = 0;
    try {
      x = std::stod(s, &pos);
    } catch (...) {
      pos = 0;
    }
    const std::string unit = s.substr(pos);
    const double scale = unit == "s" || unit.empty() ? 1 : unit == "ms" ? 1e-3 : unit == "us" ? 1e-6 : unit == "ns" ? 1e-9 : -1;
    if (pos > 0 && scale > 0) sec = x * scale;
  }
  if (!(sec >= 0) || !std::isfinite(sec) || sec > 10)
    return bad_cluster(ctx + " must be seconds (a number) or a string such as \"5us\", \"0.02ms\" (0 .. 10 s), got " + v.dump());
  return sec;
}

Result<LinkSpec> cluster_link_from_json(const nlohmann::json& j, const std::string& ctx) {
  if (!j.is_object()) return bad_cluster(ctx + " must be an object {\"bandwidth\": ..., \"latency\": ...}, got " + j.dump());
  CKPT_RETURN_IF_ERROR(cluster_keys(j, {"bandwidth", "latency"}, ctx));
  LinkSpec l;
  if (auto v = j.find("bandwidth"); v != j.end()) {
    CKPT_ASSIGN_OR_RETURN(uint64_t bw, bytes_field(*v, ctx + " key 'bandwidth'", true));
    if (bw == 0) return bad_cluster(ctx + " key 'bandwidth' must be > 0");
    l.bytes_per_s = static_cast<double>(bw);
  }
  if (auto v = j.find("latency"); v != j.end()) {
    CKPT_ASSIGN_OR_RETURN(l.latency_s, cluster_latency_field(*v, ctx + " key 'latency'"));
  }
  return l;
}

Status cluster_links_from_json(const nlohmann::json& j, Cluster& c) {
  if (!j.is_object()) return bad_cluster("cluster key 'links' must be an object {\"intra_node\": ..., \"inter_node\": ...}");
  CKPT_RETURN_IF_ERROR(cluster_keys(j, {"intra_node", "inter_node"}, "cluster links"));
  if (auto v = j.find("intra_node"); v != j.end()) {
    CKPT_ASSIGN_OR_RETURN(c.intra_node, cluster_link_from_json(*v, "cluster links.intra_node"));
  }
  if (auto v = j.find("inter_node"); v != j.end()) {
    CKPT_ASSIGN_OR_RETURN(c.inter_node, cluster_link_from_json(*v, "cluster links.inter_node"));
  }
  return Status::Ok();
}

Status cluster_nodes_from_json(const nlohmann::json& nj, Cluster& c) {
  if (!nj.is_array() || nj.empty()) return bad_cluster("cluster key 'nodes' must be a non-empty array of {\"name\", \"devices\"}");
  for (size_t i = 0; i < nj.size(); ++i) {
    const nlohmann::json& e = nj[i];
    std::string ctx = "cluster nodes[" + std::to_string(i) + "]";
    if (!e.is_object()) return bad_cluster(ctx + " must be an object {\"name\": ..., \"devices\": [...]}, got " + e.dump());
    CKPT_RETURN_IF_ERROR(cluster_keys(e, {"name", "devices", "intra_node"}, ctx));
    NodeSpec n;
    n.name = "node" + std::to_string(i);
    if (auto v = e.find("name"); v != e.end()) {
      if (!v->is_string() || v->get<std::string>().empty() || v->get<std::string>().size() > 256)
        return bad_cluster(ctx + " key 'name' must be a non-empty string (at most 256 bytes), got " + v->dump());
      n.name = v->get<std::string>();
    }
    for (const NodeSpec& o : c.nodes)
      if (o.name == n.name) return bad_cluster("cluster node '" + n.name + "' is defined twice");
    ctx = "cluster node '" + n.name + "'";
    auto d = e.find("devices");
    if (d == e.end()) return bad_cluster(ctx + " is missing key 'devices' (an array of {\"type\": NAME, \"count\": N})");
    if (d->is_array() && d->empty()) return bad_cluster(ctx + " is empty: key 'devices' lists no device (remove the node or give it devices)");
    n.first_rank = c.world_size();
    CKPT_RETURN_IF_ERROR(ranks_from_json(*d, c, ctx + " key 'devices'", ctx + " devices"));
    n.count = c.world_size() - n.first_rank;
    if (auto v = e.find("intra_node"); v != e.end()) {
    CKPT_ASSIGN_OR_RETURN(n.intra, cluster_link_from_json(*v, ctx + " key 'intra_node'"));
  }
    c.rank_node.insert(c.rank_node.end(), static_cast<size_t>(n.count), static_cast<int>(c.nodes.size()));
    c.nodes.push_back(std::move(n));
  }
  c.topology = true;
  return Status::Ok();
}

nlohmann::json cluster_link_to_json(const LinkSpec& l) {
  nlohmann::json j = nlohmann::json::object();
  if (l.bytes_per_s > 0) j["bandwidth"] = static_cast<uint64_t>(l.bytes_per_s);
  if (l.latency_s >= 0) j["latency"] = l.latency_s;
  return j;
}

nlohmann::json cluster_runs_to_json(const Cluster& c, size_t begin, size_t end) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t r = begin; r < end;) {
    size_t e = r;
    while (e < end && c.rank_type[e] == c.rank_type[r]) ++e;
    out.push_back({{"type", c.types[static_cast<size_t>(c.rank_type[r])].name}, {"count", e - r}});
    r = e;
  }
  return out;
}

}  // namespace

LinkSpec Cluster::link(int a, int b) const {
  const bool same = node_of(a) == node_of(b);
  LinkSpec l = same ? intra_node : inter_node;
  if (same && !nodes.empty()) {
    const NodeSpec& n = nodes.at(static_cast<size_t>(node_of(a)));
    if (n.intra.bytes_per_s > 0) l.bytes_per_s = n.intra.bytes_per_s;
    if (n.intra.latency_s >= 0) l.latency_s = n.intra.latency_s;
  }
  if (l.bytes_per_s <= 0) {
    const double da = device_of(a).link_bytes_per_s, db = device_of(b).link_bytes_per_s;
    l.bytes_per_s = da > 0 && db > 0 ? std::min(da, db) : da > 0 ? da : db > 0 ? db : kDefaultLinkBytesPerS;
  }
  if (l.latency_s < 0) l.latency_s = same ? kDefaultIntraLatencyS : kDefaultInterLatencyS;
  return l;
}

LinkSpec Cluster::slowest_link(const std::vector<int>& ranks) const {
  if (ranks.empty()) return LinkSpec{kDefaultLinkBytesPerS, 0};
  LinkSpec worst = link(ranks[0], ranks[0]);
  // Links depend only on (node, device type) pairs: compare one rank per distinct pair.
  std::vector<std::pair<int, int>> seen;
  std::vector<int> reps;
  for (int r : ranks) {
    const std::pair<int, int> key{node_of(r), rank_type.at(static_cast<size_t>(r))};
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
    seen.push_back(key);
    reps.push_back(r);
  }
  for (size_t i = 0; i < reps.size(); ++i)
    for (size_t k = i; k < reps.size(); ++k) {
      const LinkSpec l = link(reps[i], reps[k]);
      if (l.bytes_per_s < worst.bytes_per_s || (l.bytes_per_s == worst.bytes_per_s && l.latency_s > worst.latency_s)) worst = l;
    }
  return worst;
}

Result<Cluster> Cluster::from_json(const nlohmann::json& j) {
  if (!j.is_object()) return bad_cluster("cluster must be a JSON object {\"device_types\": [...], \"ranks\": [...]}");
  CKPT_RETURN_IF_ERROR(cluster_keys(j, {"device_types", "ranks", "nodes", "links"}, "cluster"));
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
  auto nj = j.find("nodes");
  if (rj == j.end() && nj == j.end())
    return bad_cluster("cluster is missing key 'ranks' (the device type of every rank, in rank order) or 'nodes'");
  if (nj != j.end()) {
    CKPT_RETURN_IF_ERROR(cluster_nodes_from_json(*nj, c));
    if (rj != j.end()) {  // both: must agree
      Cluster flat;
      flat.types = c.types;
      CKPT_RETURN_IF_ERROR(ranks_from_json(*rj, flat));
      if (flat.rank_type != c.rank_type)
        return bad_cluster("cluster keys 'ranks' and 'nodes' disagree: the ranks are the nodes' devices in order "
                           "(give one of the two)");
    }
  } else {
    CKPT_RETURN_IF_ERROR(ranks_from_json(*rj, c));
  }
  if (auto v = j.find("links"); v != j.end()) CKPT_RETURN_IF_ERROR(cluster_links_from_json(*v, c));
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
  for (size_t i = 0; i < types.size(); ++i) {
    if (types[i].efficiency > 0) types_j[i]["efficiency"] = types[i].efficiency;
    if (!types[i].profile.empty()) types_j[i]["profile"] = types[i].profile;
  }
  nlohmann::json out = {{"device_types", types_j}};
  if (!topology || nodes.empty()) {
    out["ranks"] = cluster_runs_to_json(*this, 0, rank_type.size());
  } else {
    nlohmann::json nodes_j = nlohmann::json::array();
    for (const NodeSpec& n : nodes) {
      nlohmann::json e = {
          {"name", n.name},
          {"devices", cluster_runs_to_json(*this, static_cast<size_t>(n.first_rank), static_cast<size_t>(n.first_rank + n.count))}};
      if (n.intra.bytes_per_s > 0 || n.intra.latency_s >= 0) e["intra_node"] = cluster_link_to_json(n.intra);
      nodes_j.push_back(std::move(e));
    }
    out["nodes"] = std::move(nodes_j);
  }
  nlohmann::json links = nlohmann::json::object();
  if (intra_node.bytes_per_s > 0 || intra_node.latency_s >= 0) links["intra_node"] = cluster_link_to_json(intra_node);
  if (inter_node.bytes_per_s > 0 || inter_node.latency_s >= 0) links["inter_node"] = cluster_link_to_json(inter_node);
  if (!links.empty()) out["links"] = std::move(links);
  return out;
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
