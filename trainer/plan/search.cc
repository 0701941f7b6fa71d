// search_layouts (trainer/plan/search.h; docs/PLAN.md "Search").
#include "trainer/plan/search.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <tuple>

#include "trainer/memory_estimate.h"
#include "trainer/plan/search_arranged.h"
#include "trainer/plan/search_space.h"
#include "trainer/plan/stage_split.h"

namespace ckpt::trainer {

PlanOptions plan_options_of(const SearchOptions& opt, std::vector<int> placement) {
  PlanOptions po{opt.global_batch, opt.seq_len, std::move(placement), opt.calibration};
  po.memory_model = opt.memory_model;
  po.config = opt.config;
  return po;
}

namespace {

using search_detail::Arranged;
using search_detail::TpGroup;

Status plan_search_bad(const std::string& msg) { return Status::Error("BadPlan", msg); }

// The layout and placement of arrangement `a` of groups `g` with its splits (per pipeline) and
// micro-batches.
Result<PlanCandidate> search_build(const ModelSpec& model, const Cluster& cluster, const SearchOptions& opt, const std::vector<TpGroup>& g,
                                   const search_detail::Arrangement& a, const std::vector<std::vector<int>>& splits,
                                   const std::vector<int64_t>& b, int zero, std::pair<int, int> ep) {
  std::vector<PipelineSpec> pls;
  for (size_t p = 0; p < a.size(); ++p) {
    PipelineSpec ps;
    ps.micro_batch = static_cast<int>(b[p]);
    for (size_t st = 0; st < a[p].size(); ++st) {
      const TpGroup& grp = g[static_cast<size_t>(a[p][st])];
      ps.stages.push_back({splits[p][st], grp.tp, cluster.types[static_cast<size_t>(grp.type)].name});
    }
    pls.push_back(std::move(ps));
  }
  PlanCandidate c;
  CKPT_ASSIGN_OR_RETURN(c.layout, Layout::from_pipelines(std::move(pls), zero));
  if (ep.first > 1 || ep.second > 0) {  // Layout's ep / etp: the symmetric form (identical pipelines of one tp)
    CKPT_ASSIGN_OR_RETURN(c.layout, c.layout.as_symmetric("expert parallelism"));
    c.layout.ep = ep.first, c.layout.etp = ep.second;
  }
  c.placement.assign(static_cast<size_t>(c.layout.world_size()), -1);
  const std::vector<std::vector<int>> first = layout_first_ranks(c.layout);
  for (size_t p = 0; p < a.size(); ++p)
    for (size_t st = 0; st < a[p].size(); ++st) {
      const TpGroup& grp = g[static_cast<size_t>(a[p][st])];
      for (int j = 0; j < grp.tp; ++j) c.placement[static_cast<size_t>(first[p][st] + j)] = grp.ranks[static_cast<size_t>(j)];
    }
  CKPT_ASSIGN_OR_RETURN(c.cost, evaluate(model, cluster, c.layout, plan_options_of(opt, c.placement)));
  return c;
}

struct SearchState {
  const ModelSpec* model;
  const Cluster* cluster;
  const SearchOptions* opt;
  std::vector<PlanCandidate> best;
  int64_t evaluated = 0;
  // The groups and arrangement of the item being valued (built again only for a candidate).
  std::function<std::pair<std::shared_ptr<const std::vector<TpGroup>>, search_detail::Arrangement>()> arrangement;
  double kth() const { return static_cast<int>(best.size()) < opt->top ? kInfeasible : best.back().cost.step_time_s; }
  // `predicted`: the search's value of the layout (evaluate() gives the same up to rounding): one
  // that cannot enter the top K is not built.
  // ep: (ep, etp) of an expert-parallel candidate ((1, 0): none).
  Status offer(const std::vector<std::vector<int>>& splits, const std::vector<int64_t>& b, int zero, double predicted,
               std::pair<int, int> ep = {1, 0}) {
    ++evaluated;
    if (predicted > kth() * (1 + 1e-9)) return Status::Ok();
    const auto [g, a] = arrangement();
    CKPT_ASSIGN_OR_RETURN(PlanCandidate c, search_build(*model, *cluster, *opt, *g, a, splits, b, zero, ep));
    if (!c.cost.feasible || c.cost.step_time_s >= kth()) return Status::Ok();
    for (const PlanCandidate& o : best)
      if (o.placement == c.placement && o.layout.to_json() == c.layout.to_json()) return Status::Ok();
    best.push_back(std::move(c));
    std::stable_sort(best.begin(), best.end(),
                     [](const PlanCandidate& a, const PlanCandidate& b2) { return a.cost.step_time_s < b2.cost.step_time_s; });
    if (static_cast<int>(best.size()) > opt->top) best.pop_back();
    return Status::Ok();
  }
};

// The bound of docs/PLAN.md "Bound" from the pipelines' summed speeds V_p (as value -> pipelines)
// and the fastest TP group's speed g: every pipeline's time is at least W_p (1/g + (m-1)/V_p)
// (W_p: FLOPs of one of its micro-batches), and sum_p W_p = W / m.
double search_bound(const ModelSpec& model, const SearchOptions& opt, const std::map<double, int64_t>& speeds, double fastest,
                    int64_t m) {
  const double k = static_cast<double>(m - 1);
  double capacity = 0;
  for (const auto& [v, n] : speeds) capacity += static_cast<double>(n) / (1 / fastest + k / v);
  return model.step_flops(opt.global_batch, opt.seq_len) / static_cast<double>(m) / capacity;
}

// Every TP group's speed (peak x efficiency x the calibration's concurrency factor of its node).
std::vector<double> search_group_speeds(const Cluster& cluster, const SearchOptions& opt, const std::vector<TpGroup>& g) {
  std::vector<int> all(static_cast<size_t>(cluster.world_size()));
  for (int r = 0; r < cluster.world_size(); ++r) all[static_cast<size_t>(r)] = r;
  const std::vector<int> on_node = ranks_per_node(cluster, all);
  std::vector<double> out;
  for (const TpGroup& grp : g) {
    double v = 0;
    for (int r : grp.ranks)
      v += cluster.device_of(r).peak_flops * Cluster::efficiency_of(cluster.device_of(r)) *
           opt.calibration.speed_scale(on_node[static_cast<size_t>(cluster.node_of(r))]);
    out.push_back(v);
  }
  return out;
}

// ZeRO-1 over identical pipelines (one class): one split, the largest b's.
Status search_zero(SearchState& st, Arranged& x, int64_t B, std::pair<int, int> ep = {1, 0}) {
  const size_t P = x.cls.size();
  x.zero_ways = static_cast<int>(P);
  x.memo.clear();
  x.cutoff = st.kth() * (1 + 1e-9);
  std::vector<int64_t> bz(P, B / static_cast<int64_t>(P));
  for (size_t p = 0; p < static_cast<size_t>(B % static_cast<int64_t>(P)); ++p) ++bz[p];
  if (bz.back() < 1) return Status::Ok();
  const SplitResult& r = x.pipeline(0, bz[0]);
  if (!r.ok) return Status::Ok();
  return st.offer(std::vector<std::vector<int>>(P, r.layers), bz, 1, r.value, ep);
}

// Expert parallelism (an MoE model; identical pipelines whose stages share one tp, as Layout's ep
// needs): every (ep, etp) of search_detail::ep_choices, without and with ZeRO-1.
Status search_experts(SearchState& st, Arranged& x, int64_t B) {
  if (!st.model->moe() || x.classes() != 1) return Status::Ok();
  const std::vector<int>& tps = x.tps[0];
  if (std::any_of(tps.begin(), tps.end(), [&](int t) { return t != tps[0]; })) return Status::Ok();
  const size_t P = x.cls.size();
  for (const auto& [ep, etp] : search_detail::ep_choices(*st.model, tps[0], static_cast<int>(P))) {
    x.ep = ep, x.etp = etp;
    x.zero_ways = 1;
    x.memo.clear();
    x.cutoff = st.kth() * (1 + 1e-9);
    const search_detail::Allocation al = search_detail::allocate(x, B);
    if (!al.b.empty())
      CKPT_RETURN_IF_ERROR(st.offer(std::vector<std::vector<int>>(P, x.pipeline(0, al.b[0]).layers), al.b, 0, al.value, {ep, etp}));
    if (P > 1 && st.opt->allow_zero) CKPT_RETURN_IF_ERROR(search_zero(st, x, B, {ep, etp}));
  }
  x.ep = 1, x.etp = 0;
  return Status::Ok();
}

Status search_one(SearchState& st, Arranged& x, int64_t m) {
  const int64_t B = st.opt->global_batch / m;
  const size_t P = x.cls.size();
  x.m = m;
  x.zero_ways = 1;
  x.memo.clear();
  const search_detail::Allocation al = search_detail::allocate(x, B);
  if (!al.b.empty()) {
    std::vector<std::vector<int>> splits;
    for (size_t p = 0; p < P; ++p) splits.push_back(x.pipeline(static_cast<size_t>(x.cls[p]), al.b[p]).layers);
    CKPT_RETURN_IF_ERROR(st.offer(splits, al.b, 0, al.value));
  }
  if (P > 1 && st.opt->allow_zero && x.classes() == 1) CKPT_RETURN_IF_ERROR(search_zero(st, x, B));
  return search_experts(st, x, B);
}

// One point of the space: a tp choice (combo), and either a listed arrangement (arr >= 0) or the
// uniform arrangement of P pipelines in type order `order`; m micro-batches.
struct SearchItem {
  double bound;
  size_t combo;
  int arr, P, order;
  int64_t m;
};

struct SearchSpace {
  std::vector<std::vector<int>> tp_of;                       // per combo
  std::vector<std::vector<search_detail::Arrangement>> arr;  // per combo: listed arrangements (small)
  std::vector<std::vector<int>> orders;                      // permutations of the used types
  std::map<size_t, std::shared_ptr<const std::vector<TpGroup>>> cache;  // groups of recently visited combos
  std::vector<SearchItem> items;
};

// The items of one combo with their bounds (the uniform arrangements described, not listed).
void search_add_combo(const SearchState& st, const std::vector<TpGroup>& g, size_t ci, SearchSpace& sp, SearchResult& res) {
  const SearchOptions& opt = *st.opt;
  const std::vector<double> speed = search_group_speeds(*st.cluster, opt, g);
  const double fastest = *std::max_element(speed.begin(), speed.end());
  auto add = [&](const std::map<double, int64_t>& v, int arr, int P, int64_t pipelines) {
    for (int64_t m = 1; m <= opt.global_batch; ++m)
      if (opt.global_batch % m == 0 && opt.global_batch / m >= pipelines) {
        const double bound = search_bound(*st.model, opt, v, fastest, m);
        if (arr >= 0) sp.items.push_back({bound, ci, arr, 0, 0, m});
        for (int o = 0; arr < 0 && o < static_cast<int>(sp.orders.size()); ++o) sp.items.push_back({bound, ci, -1, P, o, m});
      }
  };
  if (static_cast<int>(g.size()) <= opt.exhaustive_groups) {
    search_detail::all_arrangements(g, static_cast<int>(st.model->layers), sp.arr[ci]);
    for (size_t a = 0; a < sp.arr[ci].size(); ++a) {
      std::map<double, int64_t> v;
      for (const auto& pl : sp.arr[ci][a]) {
        double sum = 0;
        for (int i : pl) sum += speed[static_cast<size_t>(i)];
        ++v[sum];
      }
      add(v, static_cast<int>(a), 0, static_cast<int64_t>(sp.arr[ci][a].size()));
    }
    return;
  }
  res.exhaustive = false;
  std::map<int, std::vector<double>> by_type;  // type -> group speeds in rank order
  for (size_t i = 0; i < g.size(); ++i) by_type[g[i].type].push_back(speed[i]);
  for (int P : search_detail::uniform_pipeline_counts(g, static_cast<int>(st.model->layers))) {
    std::vector<double> pipe(static_cast<size_t>(P), 0.0);
    for (auto& [t, sv] : by_type) {
      const size_t k = sv.size() / static_cast<size_t>(P);
      for (size_t i = 0; i < sv.size(); ++i) pipe[i / k] += sv[i];
    }
    std::map<double, int64_t> v;
    for (double x : pipe) ++v[x];
    add(v, -1, P, P);
  }
}

// The groups of combo ci (rebuilt when not cached: the cache keeps a few combos).
std::shared_ptr<const std::vector<TpGroup>> search_groups(const Cluster& cluster, const std::vector<int>& types, bool cross_node,
                                                          size_t ci, SearchSpace& sp) {
  auto it = sp.cache.find(ci);
  if (it != sp.cache.end()) return it->second;
  if (sp.cache.size() >= 8) sp.cache.erase(sp.cache.begin());
  auto g = std::make_shared<const std::vector<TpGroup>>(search_detail::make_groups(cluster, types, sp.tp_of[ci], cross_node));
  return sp.cache.emplace(ci, std::move(g)).first->second;
}

// The arrangement of an item.
search_detail::Arrangement search_arrangement(const SearchSpace& sp, const SearchItem& it, const std::vector<TpGroup>& g) {
  return it.arr >= 0 ? sp.arr[it.combo][static_cast<size_t>(it.arr)]
                     : search_detail::uniform_arrangement(g, it.P, sp.orders[static_cast<size_t>(it.order)]);
}

// Every (arrangement, m) of one tp choice per type, visited by bound; stops at the K-th best.
Status search_pass(SearchState& st, bool cross_node, SearchResult& res, EmbeddedStageMemory* embedded) {
  const ModelSpec& model = *st.model;
  const Cluster& cluster = *st.cluster;
  const std::vector<int> types = search_detail::used_types(cluster);
  const auto choices = search_detail::tp_choices(model, cluster, types, cross_node);
  for (const auto& c : choices)
    if (c.empty()) return Status::Ok();
  SearchSpace sp;
  sp.orders.push_back(types);
  for (std::vector<int> o = types; std::next_permutation(o.begin(), o.end());) sp.orders.push_back(o);
  std::vector<size_t> idx(types.size(), 0);
  while (true) {
    std::vector<int> tp_of;
    for (size_t i = 0; i < types.size(); ++i) tp_of.push_back(choices[i][idx[i]]);
    sp.tp_of.push_back(tp_of);
    sp.arr.emplace_back();
    search_add_combo(st, *search_groups(cluster, types, cross_node, sp.tp_of.size() - 1, sp), sp.tp_of.size() - 1, sp, res);
    size_t i = 0;
    while (i < idx.size() && ++idx[i] == choices[i].size()) idx[i++] = 0;
    if (i == idx.size()) break;
  }
  std::stable_sort(sp.items.begin(), sp.items.end(), [](const SearchItem& a, const SearchItem& b) { return a.bound < b.bound; });
  res.arrangements += static_cast<int64_t>(sp.items.size());
  // Arrangements visited, with their classes only (the same for every m; small: no groups).
  std::map<std::tuple<size_t, int, int, int>, Arranged> visited;
  for (const SearchItem& it : sp.items) {
    if (it.bound >= st.kth()) break;  // admissible: no later item can enter the top K
    ++res.visited;
    const auto key = std::make_tuple(it.combo, it.arr, it.P, it.order);
    auto found = visited.find(key);
    if (found == visited.end()) {
      if (visited.size() >= 8192) visited.clear();
      const auto g = search_groups(cluster, types, cross_node, it.combo, sp);
      Arranged x;
      x.model = &model, x.groups = g.get(), x.embedded = embedded, x.s = st.opt->seq_len;
      x.a = search_arrangement(sp, it, *g);
      search_detail::make_classes(cluster, st.opt->calibration, cross_node, x);
      x.groups = nullptr, x.a = {};
      found = visited.emplace(key, std::move(x)).first;
    }
    st.arrangement = [&]() {
      auto g = search_groups(cluster, types, cross_node, it.combo, sp);
      auto a = search_arrangement(sp, it, *g);
      return std::make_pair(std::move(g), std::move(a));
    };
    Arranged& x = found->second;
    x.cutoff = st.kth() * (1 + 1e-9);
    CKPT_RETURN_IF_ERROR(search_one(st, x, it.m));
    x.memo.clear();
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
  if (opt.memory_model == MemoryModel::kEmbedded && !opt.config) return plan_search_bad("the embedded memory model needs the model's config");
  std::optional<EmbeddedStageMemory> embedded;
  if (opt.memory_model == MemoryModel::kEmbedded) embedded.emplace(*opt.config, cluster.world_size());
  SearchState st{&model, &cluster, &opt, {}, 0, {}};
  CKPT_RETURN_IF_ERROR(search_pass(st, false, res, embedded ? &*embedded : nullptr));
  if (st.best.empty()) {
    res.cross_node_tp = true;
    CKPT_RETURN_IF_ERROR(search_pass(st, true, res, embedded ? &*embedded : nullptr));
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
    if (opt.memory_model == MemoryModel::kEmbedded)
      msg += "; memory model embedded: every rank of `ckpt train` also holds its process constant (" +
             search_gib(static_cast<double>(process_bytes(cluster.world_size() > 1, cluster.world_size()))) +
             ") and fp32 weights, gradients and Adam moments";
    return Status::Error("PlanInfeasible", msg);
  }
  res.best = std::move(st.best);
  return res;
}

}  // namespace ckpt::trainer
