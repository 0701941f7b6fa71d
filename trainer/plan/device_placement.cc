// assign_placement (trainer/plan/cost_model.h): layout ranks onto cluster devices.
#include <algorithm>
#include <map>

#include "trainer/plan/cost_model.h"

namespace ckpt::trainer {

Result<std::vector<int>> assign_placement(const Cluster& cluster, const Layout& layout) {
  const int world = layout.world_size();
  if (world == cluster.world_size() && check_cluster_layout(cluster, layout).ok()) {
    std::vector<int> id(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) id[static_cast<size_t>(r)] = r;
    return id;
  }
  if (world > cluster.world_size())
    return Status::Error("ClusterMismatch", "the layout " + layout.to_string() + " needs " + std::to_string(world) +
                                                " devices, the cluster has " + std::to_string(cluster.world_size()));
  // Free devices per (node, type), in rank order.
  std::map<std::pair<int, int>, std::vector<int>> free;
  for (int r = cluster.world_size() - 1; r >= 0; --r)
    free[{cluster.node_of(r), cluster.rank_type[static_cast<size_t>(r)]}].push_back(r);  // back() = lowest rank
  std::vector<int> out(static_cast<size_t>(world), -1);
  for (int s = 0; s < layout.max_stages(); ++s)
    for (int p = 0; p < layout.num_pipelines(); ++p) {
      if (s >= layout.num_stages(p)) continue;
      const int t = layout.stage_tp(p, s);
      const std::string want = layout.stage_device(p, s);
      auto type_ok = [&](int ty) { return want.empty() || cluster.types[static_cast<size_t>(ty)].name == want; };
      // Best fit: the (node, type) with the fewest free devices that still holds the whole group.
      std::pair<int, int> best{-1, -1};
      size_t best_n = SIZE_MAX;
      for (auto& [key, v] : free)
        if (type_ok(key.second) && v.size() >= static_cast<size_t>(t) && v.size() < best_n) best = key, best_n = v.size();
      for (int j = 0; j < t; ++j) {
        std::vector<int>* src = best.first >= 0 ? &free[best] : nullptr;
        if (!src || src->empty()) {
          src = nullptr;
          for (auto& [key, v] : free)
            if (type_ok(key.second) && !v.empty()) { src = &v; break; }
        }
        if (!src) {
          int have = 0, need = 0;
          for (int r = 0; r < cluster.world_size(); ++r) have += type_ok(cluster.rank_type[static_cast<size_t>(r)]) ? 1 : 0;
          for (int q = 0; q < layout.num_pipelines(); ++q)
            for (int k = 0; k < layout.num_stages(q); ++k)
              if (want.empty() || layout.stage_device(q, k) == want) need += layout.stage_tp(q, k);
          return Status::Error("ClusterMismatch", "the layout needs " + std::to_string(need) + " devices of type '" +
                                                      (want.empty() ? std::string("any") : want) + "', the cluster has " +
                                                      std::to_string(have));
        }
        out[static_cast<size_t>(layout.rank_of(s, p, j))] = src->back();
        src->pop_back();
      }
    }
  return out;
}

}  // namespace ckpt::trainer
