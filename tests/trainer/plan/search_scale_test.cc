// trainer/plan/search.h at scale: the search (pipelines grouped into classes of equal places,
// uniform arrangements described, not listed, candidates built only when they can enter the top K)
// against a naive restatement of the old search over the same space on random multi-node clusters
// with more TP groups than the listed arrangements cover: every tp choice, every arrangement of
// pipelines of equal composition, every m; each pipeline's stage places computed on its own with
// the cluster's pairwise slowest link; micro-batches by greedy min-max (one sequence at a time to
// the pipeline that stays fastest: optimal for non-decreasing times); ZeRO-1 when every pipeline's
// places are equal. Also: slowest_link_of against Cluster::slowest_link, the classes of a large
// cluster, layout_text's "N x" runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "trainer/plan/search.h"
#include "trainer/plan/search_arranged.h"
#include "trainer/plan/search_space.h"
#include "trainer/plan/stage_split.h"

namespace ckpt::trainer {
namespace plan_search_scale_test {

using search_detail::Arrangement;
using search_detail::TpGroup;

bool same_place(const StagePlace& a, const StagePlace& b) {
  auto eq = [](const LinkSpec& x, const LinkSpec& y) { return x.bytes_per_s == y.bytes_per_s && x.latency_s == y.latency_s; };
  return a.device == b.device && a.capacity == b.capacity && eq(a.tp_link, b.tp_link) && eq(a.prev_link, b.prev_link) &&
         eq(a.next_link, b.next_link) && eq(a.dp_link, b.dp_link) && a.has_prev == b.has_prev && a.has_next == b.has_next &&
         a.speed_scale == b.speed_scale && a.micro_batch_overhead_s == b.micro_batch_overhead_s;
}

// The naive value of one arrangement with m micro-batches (ZeRO 0, and ZeRO-1 when allowed).
double naive_arrangement(const ModelSpec& model, const Cluster& c, const SearchOptions& o, const std::vector<TpGroup>& g,
                         const Arrangement& a, int64_t m) {
  const size_t P = a.size();
  std::vector<int> all(static_cast<size_t>(c.world_size()));
  for (int r = 0; r < c.world_size(); ++r) all[static_cast<size_t>(r)] = r;
  const std::vector<int> on_node = ranks_per_node(c, all);
  std::vector<std::vector<StagePlace>> places(P);
  for (size_t p = 0; p < P; ++p)
    for (size_t st = 0; st < a[p].size(); ++st) {
      std::vector<int> reps;
      for (size_t q = 0; q < P && P > 1; ++q) reps.push_back(g[a[q][q == p ? st : std::min(st, a[q].size() - 1)]].ranks[0]);
      const auto& ranks = g[a[p][st]].ranks;
      const std::vector<int> prev = st > 0 ? g[a[p][st - 1]].ranks : std::vector<int>{};
      const std::vector<int> next = st + 1 < a[p].size() ? g[a[p][st + 1]].ranks : std::vector<int>{};
      places[p].push_back(make_stage_place(c, ranks, prev, next, reps));
      apply_calibration(places[p].back(), c, ranks, on_node, o.calibration, prev, next);
    }
  auto value = [&](size_t p, int64_t b, int zero) {
    const int S = static_cast<int>(a[p].size());
    auto cost = [&](int st, int n) {
      const StageShape sh{n, g[a[p][st]].tp, st == 0, st == S - 1};
      return stage_cost(model, places[p][st], sh, b, o.seq_len, m, st, S, static_cast<int>(P), zero);
    };
    return best_split(static_cast<int>(model.layers), S, static_cast<double>(m - 1),
                      [&](int st, int n) { const StageCost x = cost(st, n); return x.memory() > x.capacity ? kInfeasible : x.time_s(); },
                      [&](int st, int n) { return cost(st, n).dp_sync_s; }).value;
  };
  const int64_t B = o.global_batch / m;
  std::vector<int64_t> b(P, 1);
  for (int64_t left = B - static_cast<int64_t>(P); left > 0; --left) {  // greedy min-max
    size_t w = 0;
    for (size_t p = 1; p < P; ++p)
      if (value(p, b[p] + 1, 1) < value(w, b[w] + 1, 1)) w = p;
    ++b[w];
  }
  double best = 0;
  for (size_t p = 0; p < P; ++p) best = std::max(best, value(p, b[p], 1));
  bool identical = P > 1 && o.allow_zero;
  for (size_t p = 1; p < P && identical; ++p) {
    identical = a[p].size() == a[0].size();
    for (size_t st = 0; st < a[p].size() && identical; ++st)
      identical = g[a[p][st]].tp == g[a[0][st]].tp && same_place(places[p][st], places[0][st]);
  }
  if (identical) best = std::min(best, value(0, B / static_cast<int64_t>(P) + (B % static_cast<int64_t>(P) ? 1 : 0),
                                             static_cast<int>(P)));
  return best;
}

// The best value of the whole space (the old search without its pruning and its sharing).
double naive_search(const ModelSpec& model, const Cluster& c, const SearchOptions& o) {
  const std::vector<int> types = search_detail::used_types(c);
  const auto choices = search_detail::tp_choices(model, c, types, false);
  double best = kInfeasible;
  std::vector<size_t> idx(types.size(), 0);
  while (true) {
    std::vector<int> tp_of;
    for (size_t i = 0; i < types.size(); ++i) tp_of.push_back(choices[i][idx[i]]);
    const auto g = search_detail::make_groups(c, types, tp_of, false);
    std::vector<Arrangement> arr;
    if (static_cast<int>(g.size()) <= o.exhaustive_groups)
      search_detail::all_arrangements(g, static_cast<int>(model.layers), arr);
    else
      search_detail::uniform_arrangements(g, static_cast<int>(types.size()), static_cast<int>(model.layers), arr);
    for (const Arrangement& a : arr)
      for (int64_t m = 1; m <= o.global_batch; ++m)
        if (o.global_batch % m == 0 && o.global_batch / m >= static_cast<int64_t>(a.size()))
          best = std::min(best, naive_arrangement(model, c, o, g, a, m));
    size_t i = 0;
    while (i < idx.size() && ++idx[i] == choices[i].size()) idx[i++] = 0;
    if (i == idx.size()) break;
  }
  return best;
}

// Nodes of one type each (2, 4 or 6 devices; in half the clusters one count per type), 2-3 types,
// 3-6 nodes, per-node link overrides.
Cluster random_multi_node(std::mt19937& rng) {
  Cluster c;
  const int ntypes = 2 + static_cast<int>(rng() % 2);
  for (int t = 0; t < ntypes; ++t) {
    DeviceType d;
    d.name = std::string(1, char('A' + t));
    d.memory_bytes = (uint64_t{1} << 20) * (48 + rng() % 200);
    d.peak_flops = 1e11 * (1 + rng() % 9);
    d.link_bytes_per_s = rng() % 3 ? 1e9 * (1 + rng() % 20) : 0;
    d.dtype = rng() % 2 ? "bf16" : "fp32";
    c.types.push_back(d);
  }
  c.topology = true;
  const int nodes = 3 + static_cast<int>(rng() % 4);
  const bool same_counts = rng() % 2;  // every node of a type alike: pipelines cross nodes at different stages
  for (int n = 0; n < nodes; ++n) {
    const int t = n < ntypes ? n : static_cast<int>(rng() % ntypes);
    const int count = same_counts ? 2 * (1 + t % 3) : 2 * (1 + static_cast<int>(rng() % 3));
    NodeSpec ns{"n" + std::to_string(n), c.world_size(), count, {}};
    if (rng() % 3 == 0) ns.intra = LinkSpec{1e9 * (1 + rng() % 30), -1};
    for (int k = 0; k < count; ++k) c.rank_type.push_back(t), c.rank_node.push_back(n);
    c.nodes.push_back(ns);
  }
  c.intra_node = {rng() % 2 ? 5e10 : 0, 5e-6};
  c.inter_node = {rng() % 2 ? 1e8 * (1 + rng() % 4) : 0, 2e-5};  // slow: where a pipeline crosses nodes matters
  return c;
}

TEST(PlanSearchScale, EqualsTheNaiveSearchOnRandomMultiNodeClusters) {
  std::mt19937 rng(38);
  const ModelSpec m{8, 256, 512, 4, 2, 64, 256, false};
  int compared = 0, uniform = 0;
  for (int trial = 0; trial < 24; ++trial) {
    Cluster c = random_multi_node(rng);
    SearchOptions o;
    o.global_batch = 4 << (rng() % 3), o.seq_len = 32 * (1 + static_cast<int64_t>(rng() % 4)), o.top = 1;
    o.exhaustive_groups = trial % 3 == 0 ? 6 : 3;  // mostly the uniform arrangements
    o.allow_zero = trial % 2 == 0;
    if (trial % 4 == 1) o.calibration = CostCalibration{{1.0, 0.9, 0.7, 0.6}, 2e-4, 3e9, 1e-4, 3e-5};
    const double ref = naive_search(m, c, o);
    auto r = search_layouts(m, c, o);
    if (!(ref < kInfeasible)) {
      EXPECT_TRUE(!r.ok() || r->cross_node_tp) << "trial " << trial;
      continue;
    }
    ASSERT_TRUE(r.ok()) << "trial " << trial << ": " << r.status().message();
    EXPECT_NEAR(r->best[0].cost.step_time_s / ref, 1.0, 1e-9) << "trial " << trial << ": " << layout_text(r->best[0].layout);
    ++compared;
    uniform += r->exhaustive ? 0 : 1;
  }
  EXPECT_GE(compared, 12);
  EXPECT_GE(uniform, 6);
}

// Pipelines that cross nodes at different stages (12 A devices on 3 nodes of 4, 4 B devices on 2
// nodes of 2; a slow inter-node link): the classes of an arrangement differ by where their
// neighbours sit, and the search still equals the naive one.
TEST(PlanSearchScale, PipelinesCrossingNodesAtDifferentStagesEqualTheNaiveSearch) {
  Cluster c;
  c.types = {{"A", "", uint64_t{256} << 20, 4e11, 0, "bf16", 0.5, ""}, {"B", "", uint64_t{256} << 20, 2e11, 0, "fp32", 0.5, ""}};
  c.topology = true;
  const int counts[] = {4, 4, 4, 2, 2};
  for (int n = 0; n < 5; ++n) {
    c.nodes.push_back({"n" + std::to_string(n), c.world_size(), counts[n], {}});
    for (int k = 0; k < counts[n]; ++k) c.rank_type.push_back(n < 3 ? 0 : 1), c.rank_node.push_back(n);
  }
  c.intra_node = {5e10, 5e-6};
  c.inter_node = {5e7, 5e-5};
  const ModelSpec m{8, 256, 512, 4, 2, 64, 256, false};
  const auto g = search_detail::make_groups(c, {0, 1}, {1, 1}, false);
  search_detail::Arranged x;
  x.model = &m, x.groups = &g, x.a = search_detail::uniform_arrangement(g, 4, {0, 1});
  search_detail::make_classes(c, CostCalibration{}, false, x);
  EXPECT_GE(x.classes(), 2u);  // 3 A groups per pipeline: some cross a node boundary
  for (int64_t G : {4, 8, 16}) {
    SearchOptions o;
    o.global_batch = G, o.seq_len = 128, o.top = 1, o.exhaustive_groups = 3;
    auto r = search_layouts(m, c, o);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_NEAR(r->best[0].cost.step_time_s / naive_search(m, c, o), 1.0, 1e-9) << "G " << G << ": " << layout_text(r->best[0].layout);
  }
}

TEST(PlanSearchScale, SlowestLinkOfEqualsTheClustersPairwiseOne) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    Cluster c = random_multi_node(rng);
    std::vector<int> ranks;
    for (int r = 0; r < c.world_size(); ++r)
      if (rng() % 2) ranks.push_back(r);
    std::shuffle(ranks.begin(), ranks.end(), rng);
    const LinkSpec a = slowest_link_of(c, ranks), b = c.slowest_link(ranks);
    EXPECT_EQ(a.bytes_per_s, b.bytes_per_s) << "trial " << trial;
    EXPECT_EQ(a.latency_s, b.latency_s) << "trial " << trial;
  }
}

// 64 nodes of 8 devices of 2 types: the pipelines of a uniform arrangement fall into a handful
// of classes (their places repeat), not one per pipeline.
TEST(PlanSearchScale, PipelinesOfALargeClusterShareAFewClasses) {
  Cluster c;
  c.types = {{"A", "", uint64_t{80} << 30, 4e14, 2e11, "bf16", 0.5, ""}, {"B", "", uint64_t{32} << 30, 2e14, 6e10, "bf16", 0.4, ""}};
  c.topology = true;
  for (int n = 0; n < 64; ++n) {
    c.nodes.push_back({"n" + std::to_string(n), n * 8, 8, {}});
    for (int k = 0; k < 8; ++k) c.rank_type.push_back(n < 32 ? 0 : 1), c.rank_node.push_back(n);
  }
  c.intra_node = {3e11, 5e-6};
  c.inter_node = {2.5e10, 2e-5};
  const ModelSpec m{80, 8192, 28672, 64, 8, 128, 128256, false};
  const auto g = search_detail::make_groups(c, {0, 1}, {2, 4}, false);  // 128 + 64 groups
  search_detail::Arranged x;
  x.model = &m;
  x.groups = &g;
  x.a = search_detail::uniform_arrangement(g, 32, {0, 1});  // 32 pipelines of 4 A groups + 2 B groups
  search_detail::make_classes(c, CostCalibration{}, false, x);
  ASSERT_EQ(x.cls.size(), 32u);
  EXPECT_LE(x.classes(), 2u);
  int64_t members = 0;
  for (int64_t k : x.members) members += k;
  EXPECT_EQ(members, 32);
}

TEST(PlanSearchScale, LayoutTextWritesRunsOfIdenticalPipelinesOnce) {
  const PipelineSpec a{1, {{3, 2, "A"}, {5, 4, "B"}}}, b{2, {{4, 2, "A"}, {4, 4, "B"}}};
  auto l = Layout::from_pipelines({a, a, a, b, a}, 0);
  ASSERT_TRUE(l.ok()) << l.status().message();
  EXPECT_EQ(layout_text(*l), "5 pipelines: 3 x mb=1 [3 tp2 A | 5 tp4 B], mb=2 [4 tp2 A | 4 tp4 B], mb=1 [3 tp2 A | 5 tp4 B] zero=0");
  EXPECT_EQ(l->to_string().find(" x "), std::string::npos);  // the layout's own text lists every pipeline
  // The report prints each run of equal pipelines once, with its range.
  Cluster c;
  c.types = {{"A", "", uint64_t{64} << 30, 1e14, 1e11, "bf16", 0.5, ""}, {"B", "", uint64_t{64} << 30, 5e13, 1e11, "bf16", 0.5, ""}};
  for (int p = 0; p < 5; ++p) c.rank_type.insert(c.rank_type.end(), {0, 0, 1, 1, 1, 1});
  auto cost = evaluate(ModelSpec{8, 256, 512, 4, 4, 64, 256, false}, c, *l, PlanOptions{36, 64, {}, {}});
  ASSERT_TRUE(cost.ok()) << cost.status().message();
  const std::string text = cost->to_text();
  EXPECT_NE(text.find("\npipelines 0..2 (3 x): micro-batch 1 x 6, 2 stages"), std::string::npos) << text;
  EXPECT_NE(text.find("\npipeline 3: micro-batch 2 x 6"), std::string::npos) << text;
  EXPECT_NE(text.find("\npipeline 4: micro-batch 1 x 6"), std::string::npos) << text;
  EXPECT_EQ(text.find("\npipeline 1:"), std::string::npos) << text;
}

}  // namespace plan_search_scale_test
}  // namespace ckpt::trainer
