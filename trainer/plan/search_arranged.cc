// Classes of pipelines and the micro-batch allocation (trainer/plan/search_arranged.h).
#include "trainer/plan/search_arranged.h"

#include <algorithm>
#include <compare>
#include <tuple>

namespace ckpt::trainer::search_detail {

StageCost Arranged::cost(size_t k, int st, int n, int64_t b) const {
  const int S = static_cast<int>(places[k].size());
  const StageShape shape{n, tps[k][static_cast<size_t>(st)], st == 0, st == S - 1, ep, etp};
  return stage_cost(*model, places[k][static_cast<size_t>(st)], shape, b, s, m, st, S, static_cast<int>(cls.size()), zero_ways,
                    embedded);
}

const SplitResult& Arranged::pipeline(size_t k, int64_t b) {
  const auto key = std::make_pair(k, b);
  auto it = memo.find(key);
  if (it != memo.end()) return it->second;
  const int S = static_cast<int>(places[k].size()), L = static_cast<int>(model->layers);
  // Every stage cost once: [stage][layers] time (infinite when it does not fit) and sync.
  std::vector<std::vector<std::pair<double, double>>> tab(static_cast<size_t>(S));
  for (int st = 0; st < S; ++st)
    for (int n = 0; n <= L - S + 1; ++n) {
      if (n == 0) {
        tab[static_cast<size_t>(st)].push_back({kInfeasible, kInfeasible});
        continue;
      }
      const StageCost c = cost(k, st, n, b);
      tab[static_cast<size_t>(st)].push_back({c.memory() > c.capacity ? kInfeasible : c.time_s(), c.after_s()});
    }
  auto at = [&tab](int st, int n) { return tab[static_cast<size_t>(st)][static_cast<size_t>(n)]; };
  SplitResult r = best_split(L, S, static_cast<double>(m - 1), [&](int st, int n) { return at(st, n).first; },
                             [&](int st, int n) { return at(st, n).second; }, cutoff);
  return memo.emplace(key, std::move(r)).first->second;
}

namespace {

// A node's class: its intra-node link override and its device count (every device is used: the
// calibration's ranks per node).
std::vector<int> arr_node_classes(const Cluster& c) {
  std::map<std::tuple<double, double, int>, int> ids;
  std::vector<int> out;
  for (int n = 0; n < c.num_nodes(); ++n) {
    const auto key = c.nodes.empty() ? std::make_tuple(0.0, -1.0, c.world_size())
                                     : std::make_tuple(c.nodes[static_cast<size_t>(n)].intra.bytes_per_s,
                                                       c.nodes[static_cast<size_t>(n)].intra.latency_s, c.nodes[static_cast<size_t>(n)].count);
    out.push_back(ids.emplace(key, static_cast<int>(ids.size())).first->second);
  }
  return out;
}

// The data-parallel link of stage st of pipeline p (evaluate()'s replicas: the stage's first rank
// and the first rank of the same stage index, or the last stage, of every other pipeline).
LinkSpec arr_dp_link(const Cluster& c, const Arranged& x, size_t p, size_t st, size_t shortest, std::map<size_t, LinkSpec>& cache) {
  const auto& g = *x.groups;
  if (st < shortest) {
    auto it = cache.find(st);
    if (it != cache.end()) return it->second;
  }
  std::vector<int> reps{g[static_cast<size_t>(x.a[p][st])].ranks[0]};
  for (size_t q = 0; q < x.a.size(); ++q)
    if (q != p) reps.push_back(g[static_cast<size_t>(x.a[q][std::min(st, x.a[q].size() - 1)])].ranks[0]);
  const LinkSpec l = slowest_link_of(c, reps);
  if (st < shortest) cache[st] = l;
  return l;
}

}  // namespace

void make_classes(const Cluster& c, const CostCalibration& cal, bool cross_node, Arranged& x) {
  const auto& g = *x.groups;
  const size_t P = x.a.size();
  const std::vector<int> node_cls = arr_node_classes(c);
  std::vector<int> all(static_cast<size_t>(c.world_size()));
  for (int r = 0; r < c.world_size(); ++r) all[static_cast<size_t>(r)] = r;
  const std::vector<int> on_node = ranks_per_node(c, all);  // every device is used
  size_t shortest = SIZE_MAX;
  for (const auto& pl : x.a) shortest = std::min(shortest, pl.size());
  std::map<size_t, LinkSpec> dp_cache;
  std::map<std::pair<double, double>, uint64_t> dp_ids;  // distinct data-parallel links
  std::map<std::vector<uint64_t>, int> class_ids;
  x.cls.assign(P, 0);
  x.members.clear(), x.places.clear(), x.tps.clear(), x.memo.clear();
  std::vector<uint64_t> key;
  std::vector<LinkSpec> dps;
  int max_tp = 0;
  for (const TpGroup& grp : g) max_tp = std::max(max_tp, grp.tp);
  const bool packable = !cross_node && node_cls.size() < (1u << 16) && c.types.size() < 500 && max_tp < 1024;
  for (size_t p = 0; p < P; ++p) {
    const auto& pl = x.a[p];
    key.clear(), dps.clear();
    for (size_t st = 0; st < pl.size(); ++st) {
      const TpGroup& grp = g[static_cast<size_t>(pl[st])];
      auto nb = [&](size_t other) {  // 1 + the neighbour's type * 2 + whether it shares the node; 0: none
        const TpGroup& o = g[static_cast<size_t>(pl[other])];
        return static_cast<uint64_t>(1 + o.type * 2 + (o.node == grp.node ? 1 : 0));
      };
      const LinkSpec dp = P > 1 ? arr_dp_link(c, x, p, st, shortest, dp_cache) : LinkSpec{};
      const uint64_t dp_id = dp_ids.emplace(std::make_pair(dp.bytes_per_s, dp.latency_s), dp_ids.size()).first->second;
      // One word per stage: node class, type, tp, neighbours, data-parallel link (fields of 10-16 bits).
      key.push_back(static_cast<uint64_t>(node_cls[static_cast<size_t>(grp.node)]) | static_cast<uint64_t>(grp.type) << 16 |
                    static_cast<uint64_t>(grp.tp) << 26 | (st > 0 ? nb(st - 1) : 0) << 36 | (st + 1 < pl.size() ? nb(st + 1) : 0) << 46 |
                    dp_id << 56);
      dps.push_back(dp);
    }
    if (!packable || dp_ids.size() > 256) key.push_back(p);  // never merged: groups across nodes, or a field out of its bits
    const auto [it, fresh] = class_ids.emplace(key, static_cast<int>(class_ids.size()));
    x.cls[p] = it->second;
    if (!fresh) {
      ++x.members[static_cast<size_t>(it->second)];
      continue;
    }
    x.members.push_back(1);
    x.places.emplace_back();
    x.tps.emplace_back();
    for (size_t st = 0; st < pl.size(); ++st) {  // the class's places, from this pipeline
      const auto& ranks = g[static_cast<size_t>(pl[st])].ranks;
      const std::vector<int> prev = st > 0 ? g[static_cast<size_t>(pl[st - 1])].ranks : std::vector<int>{};
      const std::vector<int> next = st + 1 < pl.size() ? g[static_cast<size_t>(pl[st + 1])].ranks : std::vector<int>{};
      StagePlace sp = make_stage_place(c, ranks, prev, next, {});
      if (P > 1) sp.dp_link = dps[st];
      apply_calibration(sp, c, ranks, on_node, cal, prev, next);
      x.places.back().push_back(sp);
      x.tps.back().push_back(g[static_cast<size_t>(pl[st])].tp);
    }
  }
}

namespace {

// The largest b in [1, hi] with value(k, b) <= t (0 if none); value is non-decreasing in b.
int64_t arr_cap(Arranged& x, size_t k, int64_t hi, double t) {
  int64_t lo = 0;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (x.value(k, mid) <= t) lo = mid; else hi = mid - 1;
  }
  return lo;
}

Allocation arr_balanced(Arranged& x, int64_t B) {
  const int64_t P = static_cast<int64_t>(x.cls.size());
  Allocation out;
  out.b.assign(static_cast<size_t>(P), B / P);
  for (int64_t p = 0; p < B % P; ++p) ++out.b[static_cast<size_t>(p)];
  for (int64_t b : {B / P, B / P + (B % P ? 1 : 0)})
    if (!(x.value(0, b) < kInfeasible)) return {};
  out.value = x.value(0, out.b[0]);
  return out;
}

}  // namespace

Allocation allocate(Arranged& x, int64_t B) {
  const int64_t P = static_cast<int64_t>(x.cls.size());
  const int64_t bmax = B - P + 1;
  if (bmax < 1) return {};
  if (x.classes() == 1) return arr_balanced(x, B);
  const size_t K = x.classes();
  double lo = 0, hi = 0;
  int64_t fin_sum = 0;
  for (size_t k = 0; k < K; ++k) {
    const int64_t f = arr_cap(x, k, bmax, 1e300);
    if (f < 1) return {};
    fin_sum += x.members[k] * f;
    lo = std::max(lo, x.value(k, 1));
    hi = std::max(hi, x.value(k, f));
  }
  if (fin_sum < B) return {};
  auto total = [&](double t) {
    int64_t n = 0;
    for (size_t k = 0; k < K; ++k) n += x.members[k] * arr_cap(x, k, bmax, t);
    return n;
  };
  if (total(lo) >= B) hi = lo;
  for (int it = 0; it < 200 && hi - lo > 1e-13 * hi; ++it) {
    const double mid = 0.5 * (lo + hi);
    if (total(mid) >= B) hi = mid; else lo = mid;
  }
  // Per class: `at_top` of its pipelines at b = top, the others at top - 1.
  std::vector<int64_t> top(K), at_top(x.members);
  int64_t n = 0;
  for (size_t k = 0; k < K; ++k) top[k] = arr_cap(x, k, bmax, hi), n += x.members[k] * top[k];
  while (n > B) {  // trim from the slowest pipelines that can give
    size_t w = K;
    for (size_t k = 0; k < K; ++k)
      if (top[k] > 1 && (w == K || x.value(k, top[k]) > x.value(w, top[w]))) w = k;
    const int64_t d = std::min(at_top[w], n - B);
    at_top[w] -= d, n -= d;
    if (at_top[w] == 0) --top[w], at_top[w] = x.members[w];
  }
  Allocation out;
  out.value = 0;
  std::vector<int64_t> seen(K, 0);
  for (size_t p = 0; p < static_cast<size_t>(P); ++p) {
    const size_t k = static_cast<size_t>(x.cls[p]);
    out.b.push_back(seen[k]++ < at_top[k] ? top[k] : top[k] - 1);
  }
  for (size_t k = 0; k < K; ++k) out.value = std::max(out.value, x.value(k, top[k]));
  return out;
}

}  // namespace ckpt::trainer::search_detail
