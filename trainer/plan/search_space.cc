// TP groups and arrangements (trainer/plan/search_space.h).
#include "trainer/plan/search_space.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

namespace ckpt::trainer::search_detail {

std::vector<int> used_types(const Cluster& c) {
  std::vector<int> t;
  for (int r = 0; r < c.world_size(); ++r)
    if (std::find(t.begin(), t.end(), c.rank_type[static_cast<size_t>(r)]) == t.end()) t.push_back(c.rank_type[static_cast<size_t>(r)]);
  std::sort(t.begin(), t.end());
  return t;
}

std::vector<std::vector<int>> tp_choices(const ModelSpec& m, const Cluster& c, const std::vector<int>& types, bool cross_node) {
  std::vector<std::vector<int>> out;
  for (int ty : types) {
    std::map<int, int> per_node;
    int total = 0;
    for (int r = 0; r < c.world_size(); ++r)
      if (c.rank_type[static_cast<size_t>(r)] == ty) ++per_node[c.node_of(r)], ++total;
    int g = 0;
    for (auto& [n, k] : per_node) g = std::gcd(g, k);
    if (cross_node) g = total;
    std::vector<int> ts;
    for (int t = 1; t <= g; ++t)
      if (g % t == 0 && m.tp_divides(t)) ts.push_back(t);
    out.push_back(ts);
  }
  return out;
}

std::vector<TpGroup> make_groups(const Cluster& c, const std::vector<int>& types, const std::vector<int>& tp_of, bool cross_node) {
  std::vector<TpGroup> out;
  std::map<std::pair<int, int>, int> cls;
  for (size_t i = 0; i < types.size(); ++i) {
    std::vector<int> cur;
    int cur_node = -1;
    for (int r = 0; r < c.world_size(); ++r) {
      if (c.rank_type[static_cast<size_t>(r)] != types[i]) continue;
      if (!cross_node && c.node_of(r) != cur_node) cur.clear(), cur_node = c.node_of(r);
      cur.push_back(r);
      if (static_cast<int>(cur.size()) == tp_of[i]) {
        TpGroup g;
        g.type = types[i], g.tp = tp_of[i], g.ranks = cur, g.node = c.node_of(cur[0]);
        const int node_key = cross_node ? -1 - static_cast<int>(out.size()) : g.node;  // cross-node groups: all distinct
        g.cls = cls.emplace(std::make_pair(node_key, g.type), static_cast<int>(cls.size())).first->second;
        out.push_back(std::move(g));
        cur.clear();
      }
    }
  }
  return out;
}

namespace {
// Canonical form: every pipeline as its class sequence, pipelines sorted.
std::vector<std::vector<int>> space_key(const std::vector<TpGroup>& g, const Arrangement& a) {
  std::vector<std::vector<int>> k;
  for (const auto& p : a) {
    std::vector<int> s;
    for (int i : p) s.push_back(g[static_cast<size_t>(i)].cls);
    k.push_back(s);
  }
  std::sort(k.begin(), k.end());
  return k;
}

void space_recurse(const std::vector<TpGroup>& g, size_t next, int max_stages, Arrangement& cur,
                   std::set<std::vector<std::vector<int>>>& seen, std::vector<Arrangement>& out) {
  if (next == g.size()) {
    if (seen.insert(space_key(g, cur)).second) out.push_back(cur);
    return;
  }
  const int id = static_cast<int>(next);
  cur.push_back({id});  // a new pipeline
  space_recurse(g, next + 1, max_stages, cur, seen, out);
  cur.pop_back();
  for (size_t p = 0; p < cur.size(); ++p) {
    if (static_cast<int>(cur[p].size()) >= max_stages) continue;
    for (size_t pos = 0; pos <= cur[p].size(); ++pos) {
      cur[p].insert(cur[p].begin() + static_cast<std::ptrdiff_t>(pos), id);
      space_recurse(g, next + 1, max_stages, cur, seen, out);
      cur[p].erase(cur[p].begin() + static_cast<std::ptrdiff_t>(pos));
    }
  }
}
}  // namespace

void all_arrangements(const std::vector<TpGroup>& g, int max_stages, std::vector<Arrangement>& out) {
  Arrangement cur;
  std::set<std::vector<std::vector<int>>> seen;
  space_recurse(g, 0, max_stages, cur, seen, out);
}

std::vector<int> group_types(const std::vector<TpGroup>& g) {
  std::vector<int> t;
  for (const TpGroup& x : g) t.push_back(x.type);
  std::sort(t.begin(), t.end());
  t.erase(std::unique(t.begin(), t.end()), t.end());
  return t;
}

std::vector<int> uniform_pipeline_counts(const std::vector<TpGroup>& g, int max_stages) {
  std::map<int, int> count;  // type -> groups
  for (const TpGroup& x : g) ++count[x.type];
  int common = 0;
  for (auto& [t, n] : count) common = std::gcd(common, n);
  std::vector<int> out;
  for (int P = 1; P <= common; ++P) {
    if (common % P) continue;
    int stages = 0;
    for (auto& [t, n] : count) stages += n / P;
    if (stages <= max_stages) out.push_back(P);
  }
  return out;
}

Arrangement uniform_arrangement(const std::vector<TpGroup>& g, int P, const std::vector<int>& order) {
  std::map<int, std::vector<int>> by_type;  // type -> group ids in rank order
  for (size_t i = 0; i < g.size(); ++i) by_type[g[i].type].push_back(static_cast<int>(i));
  Arrangement a(static_cast<size_t>(P));
  for (int p = 0; p < P; ++p)
    for (int t : order) {
      const std::vector<int>& ids = by_type[t];
      const size_t k = ids.size() / static_cast<size_t>(P);
      for (size_t i = 0; i < k; ++i) a[static_cast<size_t>(p)].push_back(ids[static_cast<size_t>(p) * k + i]);
    }
  return a;
}

void uniform_arrangements(const std::vector<TpGroup>& g, int num_types, int max_stages, std::vector<Arrangement>& out) {
  (void)num_types;
  for (int P : uniform_pipeline_counts(g, max_stages)) {
    std::vector<int> order = group_types(g);
    do out.push_back(uniform_arrangement(g, P, order));
    while (std::next_permutation(order.begin(), order.end()));
  }
}

std::vector<std::pair<int, int>> ep_choices(const ModelSpec& m, int tp, int P) {
  std::vector<std::pair<int, int>> out;
  if (!m.moe()) return out;
  for (int ep = 1; ep <= m.experts && ep <= static_cast<int64_t>(tp) * P; ++ep)
    for (int etp = 1; etp <= tp; ++etp)
      if (!(ep == 1 && etp == tp) && m.ep_fits(ep, etp, tp, P)) out.push_back({ep, etp});
  return out;
}

}  // namespace ckpt::trainer::search_detail
