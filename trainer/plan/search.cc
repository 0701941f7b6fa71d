// search_layouts (trainer/plan/search.h; docs/PLAN.md "Search").
#include "trainer/plan/search.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>

#include "trainer/plan/search_space.h"
#include "trainer/plan/stage_split.h"

namespace ckpt::trainer {

namespace search_detail {

// One arrangement with the places of its stages, for one m and ZeRO setting.
struct Arranged {
  const ModelSpec* model;
  const std::vector<TpGroup>* groups;
  Arrangement a;
  std::vector<std::vector<StagePlace>> places;  // [pipeline][stage]
  std::vector<std::string> sig;                 // per pipeline: identical signatures cost the same
  int64_t s = 1, m = 1;
  int zero_ways = 1;
  std::map<std::pair<std::string, int64_t>, SplitResult> memo;

  StageCost cost(size_t p, int st, int n, int64_t b) const {
    const int S = static_cast<int>(a[p].size());
    const StageShape shape{n, (*groups)[static_cast<size_t>(a[p][static_cast<size_t>(st)])].tp, st == 0, st == S - 1};
    return stage_cost(*model, places[p][static_cast<size_t>(st)], shape, b, s, m, st, S, static_cast<int>(a.size()), zero_ways);
  }
  static double time_or_inf(const StageCost& c) { return c.memory() > c.capacity ? kInfeasible : c.time_s(); }
  // The pipeline's best split and time for micro-batch b (memoized by signature).
  const SplitResult& pipeline(size_t p, int64_t b) {
    auto key = std::make_pair(sig[p], b);
    auto it = memo.find(key);
    if (it != memo.end()) return it->second;
    const int S = static_cast<int>(a[p].size());
    SplitResult r = best_split(static_cast<int>(model->layers), S, static_cast<double>(m - 1),
                               [&](int st, int n) { return time_or_inf(cost(p, st, n, b)); },
                               [&](int st, int n) { return cost(p, st, n, b).dp_sync_s; });
    return memo.emplace(key, std::move(r)).first->second;
  }
  double value(size_t p, int64_t b) { return pipeline(p, b).value; }
};

std::string search_place_sig(const StagePlace& p, int tp) {
  char buf[320];
  std::snprintf(buf, sizeof buf, "%s/%d/%a/%a/%llu/%a,%a/%a,%a/%a,%a/%a,%a/%d%d|", p.device->name.c_str(), tp, p.speed_scale,
                p.micro_batch_overhead_s,
                static_cast<unsigned long long>(p.capacity), p.tp_link.bytes_per_s, p.tp_link.latency_s, p.prev_link.bytes_per_s,
                p.prev_link.latency_s, p.next_link.bytes_per_s, p.next_link.latency_s, p.dp_link.bytes_per_s, p.dp_link.latency_s,
                p.has_prev ? 1 : 0, p.has_next ? 1 : 0);
  return buf;
}

void search_make_places(const Cluster& c, const CostCalibration& cal, Arranged& x) {
  const auto& g = *x.groups;
  const size_t P = x.a.size();
  std::vector<int> all(static_cast<size_t>(c.world_size()));
  for (int r = 0; r < c.world_size(); ++r) all[static_cast<size_t>(r)] = r;
  const std::vector<int> on_node = ranks_per_node(c, all);  // every device is used
  x.places.assign(P, {});
  x.sig.assign(P, "");
  for (size_t p = 0; p < P; ++p) {
    const auto& pl = x.a[p];
    for (size_t st = 0; st < pl.size(); ++st) {
      std::vector<int> reps;
      if (P > 1)
        for (size_t q = 0; q < P; ++q) {
          const size_t k = q == p ? st : std::min(st, x.a[q].size() - 1);
          reps.push_back(g[static_cast<size_t>(x.a[q][k])].ranks[0]);
        }
      const auto& ranks = g[static_cast<size_t>(pl[st])].ranks;
      const std::vector<int> prev = st > 0 ? g[static_cast<size_t>(pl[st - 1])].ranks : std::vector<int>{};
      const std::vector<int> next = st + 1 < pl.size() ? g[static_cast<size_t>(pl[st + 1])].ranks : std::vector<int>{};
      x.places[p].push_back(make_stage_place(c, ranks, prev, next, reps));
      apply_calibration(x.places[p].back(), c, ranks, on_node, cal, prev, next);
      x.sig[p] += search_place_sig(x.places[p].back(), g[static_cast<size_t>(pl[st])].tp);
    }
  }
}

// The largest b in [1, hi] with value(p, b) <= t (0 if none); value is non-decreasing in b.
int64_t search_cap(Arranged& x, size_t p, int64_t hi, double t) {
  int64_t lo = 0;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (x.value(p, mid) <= t) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Min-max allocation of B sequences per micro-batch round over the pipelines (each >= 1); empty
// when none fits.
std::vector<int64_t> search_allocate(Arranged& x, int64_t B) {
  const size_t P = x.a.size();
  const int64_t bmax = B - static_cast<int64_t>(P) + 1;
  if (bmax < 1) return {};
  bool same = true;
  for (size_t p = 1; p < P; ++p) same = same && x.sig[p] == x.sig[0];
  if (same) {  // identical pipelines: the balanced allocation is optimal
    std::vector<int64_t> b(P, B / static_cast<int64_t>(P));
    for (size_t p = 0; p < static_cast<size_t>(B % static_cast<int64_t>(P)); ++p) ++b[p];
    for (size_t p = 0; p < P; ++p)
      if (!(x.value(p, b[p]) < kInfeasible)) return {};
    return b;
  }
  double lo = 0, hi = 0;
  int64_t fin_sum = 0;
  for (size_t p = 0; p < P; ++p) {
    const int64_t f = search_cap(x, p, bmax, 1e300);
    if (f < 1) return {};
    fin_sum += f;
    lo = std::max(lo, x.value(p, 1));
    hi = std::max(hi, x.value(p, f));
  }
  if (fin_sum < B) return {};
  auto total = [&](double t) {
    int64_t n = 0;
    for (size_t p = 0; p < P; ++p) n += search_cap(x, p, bmax, t);
    return n;
  };
  if (total(lo) >= B) hi = lo;
  for (int it = 0; it < 200 && hi - lo > 1e-13 * hi; ++it) {
    const double mid = 0.5 * (lo + hi);
    if (total(mid) >= B) hi = mid; else lo = mid;
  }
  std::vector<int64_t> b(P);
  int64_t n = 0;
  for (size_t p = 0; p < P; ++p) b[p] = search_cap(x, p, bmax, hi), n += b[p];
  while (n > B) {  // trim from the slowest pipeline that can give
    size_t w = P;
    for (size_t p = 0; p < P; ++p)
      if (b[p] > 1 && (w == P || x.value(p, b[p]) > x.value(w, b[w]))) w = p;
    --b[w], --n;
  }
  return b;
}

}  // namespace search_detail

namespace {

using search_detail::Arranged;
using search_detail::TpGroup;

Status plan_search_bad(const std::string& msg) { return Status::Error("BadPlan", msg); }

// The layout and placement of an arrangement with its splits and micro-batches.
Result<PlanCandidate> search_build(const ModelSpec& model, const Cluster& cluster, const SearchOptions& opt, const Arranged& x,
                                   const std::vector<std::vector<int>>& splits, const std::vector<int64_t>& b, int zero) {
  const auto& g = *x.groups;
  std::vector<PipelineSpec> pls;
  for (size_t p = 0; p < x.a.size(); ++p) {
    PipelineSpec ps;
    ps.micro_batch = static_cast<int>(b[p]);
    for (size_t st = 0; st < x.a[p].size(); ++st) {
      const TpGroup& grp = g[static_cast<size_t>(x.a[p][st])];
      ps.stages.push_back({splits[p][st], grp.tp, cluster.types[static_cast<size_t>(grp.type)].name});
    }
    pls.push_back(std::move(ps));
  }
  PlanCandidate c;
  CKPT_ASSIGN_OR_RETURN(c.layout, Layout::from_pipelines(std::move(pls), zero));
  c.placement.assign(static_cast<size_t>(c.layout.world_size()), -1);
  for (size_t p = 0; p < x.a.size(); ++p)
    for (size_t st = 0; st < x.a[p].size(); ++st) {
      const TpGroup& grp = g[static_cast<size_t>(x.a[p][st])];
      for (int j = 0; j < grp.tp; ++j)
        c.placement[static_cast<size_t>(c.layout.rank_of(static_cast<int>(st), static_cast<int>(p), j))] = grp.ranks[static_cast<size_t>(j)];
    }
  PlanOptions po{opt.global_batch, opt.seq_len, c.placement, opt.calibration};
  CKPT_ASSIGN_OR_RETURN(c.cost, evaluate(model, cluster, c.layout, po));
  return c;
}

struct SearchState {
  const ModelSpec* model;
  const Cluster* cluster;
  const SearchOptions* opt;
  std::vector<PlanCandidate> best;
  int64_t evaluated = 0;
  double kth() const { return static_cast<int>(best.size()) < opt->top ? kInfeasible : best.back().cost.step_time_s; }
  Status offer(const Arranged& x, const std::vector<std::vector<int>>& splits, const std::vector<int64_t>& b, int zero) {
    ++evaluated;
    CKPT_ASSIGN_OR_RETURN(PlanCandidate c, search_build(*model, *cluster, *opt, x, splits, b, zero));
    if (!c.cost.feasible || c.cost.step_time_s >= kth()) return Status::Ok();
    for (const PlanCandidate& o : best)
      if (o.layout.to_json() == c.layout.to_json() && o.placement == c.placement) return Status::Ok();
    best.push_back(std::move(c));
    std::stable_sort(best.begin(), best.end(),
                     [](const PlanCandidate& a, const PlanCandidate& b2) { return a.cost.step_time_s < b2.cost.step_time_s; });
    if (static_cast<int>(best.size()) > opt->top) best.pop_back();
    return Status::Ok();
  }
};

// Lower bound of an arrangement's step time with m micro-batches (docs/PLAN.md "Bound"): with V_p
// the summed speed of pipeline p's devices and g the fastest TP group's, every pipeline's time is
// at least W_p (1/g + (m-1)/V_p) (W_p: FLOPs of one of its micro-batches), and sum_p W_p = W / m.
double search_bound(const ModelSpec& model, const Cluster& cluster, const SearchOptions& opt, const std::vector<TpGroup>& g,
                    const search_detail::Arrangement& a, int64_t m) {
  std::vector<int> all(static_cast<size_t>(cluster.world_size()));
  for (int r = 0; r < cluster.world_size(); ++r) all[static_cast<size_t>(r)] = r;
  const std::vector<int> on_node = ranks_per_node(cluster, all);
  auto group_speed = [&](const TpGroup& grp) {
    double v = 0;
    for (int r : grp.ranks)
      v += cluster.device_of(r).peak_flops * Cluster::efficiency_of(cluster.device_of(r)) *
           opt.calibration.speed_scale(on_node[static_cast<size_t>(cluster.node_of(r))]);
    return v;
  };
  double fastest = 0, capacity = 0;
  for (const TpGroup& grp : g) fastest = std::max(fastest, group_speed(grp));
  const double k = static_cast<double>(m - 1);
  for (const auto& p : a) {
    double v = 0;
    for (int i : p) v += group_speed(g[static_cast<size_t>(i)]);
    capacity += 1 / (1 / fastest + k / v);  // sequences' FLOPs per second the pipeline can take at most
  }
  return model.step_flops(opt.global_batch, opt.seq_len) / static_cast<double>(m) / capacity;
}

Status search_one(SearchState& st, Arranged& x, int64_t m) {
  const int64_t B = st.opt->global_batch / m;
  const size_t P = x.a.size();
  x.m = m;
  x.zero_ways = 1;
  x.memo.clear();
  std::vector<int64_t> b = search_detail::search_allocate(x, B);
  if (!b.empty()) {
    std::vector<std::vector<int>> splits;
    for (size_t p = 0; p < P; ++p) splits.push_back(x.pipeline(p, b[p]).layers);
    CKPT_RETURN_IF_ERROR(st.offer(x, splits, b, 0));
  }
  bool same = P > 1 && st.opt->allow_zero;
  for (size_t p = 1; p < P && same; ++p) same = x.sig[p] == x.sig[0];
  if (!same) return Status::Ok();
  x.zero_ways = static_cast<int>(P);  // ZeRO-1: identical pipelines, one split (the largest b's)
  x.memo.clear();
  std::vector<int64_t> bz(P, B / static_cast<int64_t>(P));
  for (size_t p = 0; p < static_cast<size_t>(B % static_cast<int64_t>(P)); ++p) ++bz[p];
  if (bz.back() < 1) return Status::Ok();
  const SplitResult& r = x.pipeline(0, bz[0]);
  if (!r.ok) return Status::Ok();
  return st.offer(x, std::vector<std::vector<int>>(P, r.layers), bz, 1);
}

}  // namespace

namespace {

// Every (arrangement, m) of one tp choice per type, visited by bound; stops at the K-th best.
Status search_pass(SearchState& st, bool cross_node, SearchResult& res) {
  const ModelSpec& model = *st.model;
  const Cluster& cluster = *st.cluster;
  const std::vector<int> types = search_detail::used_types(cluster);
  const auto choices = search_detail::tp_choices(model, cluster, types, cross_node);
  for (const auto& c : choices)
    if (c.empty()) return Status::Ok();
  std::vector<size_t> idx(types.size(), 0);
  struct Item { double bound; size_t groups; size_t arr; int64_t m; };
  std::vector<std::vector<TpGroup>> all_groups;
  std::vector<std::vector<search_detail::Arrangement>> all_arr;
  std::vector<Item> items;
  while (true) {
    std::vector<int> tp_of;
    for (size_t i = 0; i < types.size(); ++i) tp_of.push_back(choices[i][idx[i]]);
    all_groups.push_back(search_detail::make_groups(cluster, types, tp_of, cross_node));
    std::vector<search_detail::Arrangement> arr;
    const auto& g = all_groups.back();
    if (static_cast<int>(g.size()) <= st.opt->exhaustive_groups) {
      search_detail::all_arrangements(g, static_cast<int>(model.layers), arr);
    } else {
      search_detail::uniform_arrangements(g, static_cast<int>(types.size()), static_cast<int>(model.layers), arr);
      res.exhaustive = false;
    }
    for (size_t a = 0; a < arr.size(); ++a)
      for (int64_t m = 1; m <= st.opt->global_batch; ++m)
        if (st.opt->global_batch % m == 0 && st.opt->global_batch / m >= static_cast<int64_t>(arr[a].size()))
          items.push_back({search_bound(model, cluster, *st.opt, g, arr[a], m), all_groups.size() - 1, a, m});
    all_arr.push_back(std::move(arr));
    size_t i = 0;
    while (i < idx.size() && ++idx[i] == choices[i].size()) idx[i++] = 0;
    if (i == idx.size()) break;
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.bound < b.bound; });
  res.arrangements += static_cast<int64_t>(items.size());
  for (const Item& it : items) {
    if (it.bound >= st.kth()) break;  // admissible: no later item can enter the top K
    Arranged x;
    x.model = &model;
    x.groups = &all_groups[it.groups];
    x.a = all_arr[it.groups][it.arr];
    x.s = st.opt->seq_len;
    search_detail::search_make_places(cluster, st.opt->calibration, x);
    CKPT_RETURN_IF_ERROR(search_one(st, x, it.m));
  }
  return Status::Ok();
}

std::string search_gib(double b) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f GiB", b / 1073741824.0);
  return buf;
}

}  // namespace

Result<SearchResult> search_layouts(const ModelSpec& model, const Cluster& cluster, const SearchOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  if (opt.global_batch < 1 || opt.seq_len < 1 || opt.top < 1) return plan_search_bad("the global batch, sequence length and --top must be >= 1");
  for (int r = 0; r < cluster.world_size(); ++r)
    if (!(cluster.device_of(r).peak_flops > 0))
      return plan_search_bad("device type '" + cluster.device_of(r).name + "' has no peak_flops: the cost model needs its FLOP/s");
  SearchResult res;
  res.exhaustive = true;
  SearchState st{&model, &cluster, &opt, {}, 0};
  CKPT_RETURN_IF_ERROR(search_pass(st, false, res));
  if (st.best.empty()) {
    res.cross_node_tp = true;
    CKPT_RETURN_IF_ERROR(search_pass(st, true, res));
  }
  res.evaluated = st.evaluated;
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (st.best.empty()) {
    uint64_t total = 0;
    for (int r = 0; r < cluster.world_size(); ++r) total += cluster.device_of(r).memory_bytes;
    const double state = static_cast<double>(model.total_params()) * 16;
    std::string msg = "no layout of the search space fits the model (" + std::to_string(model.total_params()) +
                      " parameters: weights, gradients and Adam state alone take " + search_gib(state) +
                      " in mixed precision) on the cluster's " + std::to_string(cluster.world_size()) + " devices (" +
                      search_gib(static_cast<double>(total)) + " in total)";
    auto hand = hand_written_layout(model, cluster, opt);
    if (hand.ok() && !hand->cost.problems.empty())
      msg += "; the closest hand-written layout " + hand->layout.to_string() + ": " + hand->cost.problems[0];
    if (static_cast<double>(total) < state) msg += "; short by " + search_gib(state - static_cast<double>(total)) + " at least";
    return Status::Error("PlanInfeasible", msg);
  }
  res.best = std::move(st.best);
  return res;
}

}  // namespace ckpt::trainer
