// trainer/plan/search.h: the search's optimum against brute-force enumeration of every layout of
// its space on random small clusters (zero 0; half of them with calibrated cost terms); the worked examples ([1, 2, 3] pipeline split with
// the memory-rich slow type first; [3, 2, 1] micro-batches over three replicas); clusters where
// nothing fits get a message saying what and by how much.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "trainer/plan/search.h"

namespace ckpt::trainer {
namespace plan_search_test {

// Naive enumeration: tp per type (dividing heads/kv/ffn and each node's count), groups per node,
// every set of ordered pipelines, every split, every micro-batch vector, every m.
struct Brute {
  const ModelSpec& m;
  const Cluster& c;
  int64_t G, s;
  double best = 1e300;
  std::vector<std::vector<int>> groups;  // cluster ranks
  std::vector<int> gtype, gtp;
  CostCalibration cal;

  void eval_layout(const std::vector<std::vector<int>>& pipes, const std::vector<std::vector<int>>& splits, const std::vector<int>& mbs) {
    std::vector<PipelineSpec> pls;
    for (size_t p = 0; p < pipes.size(); ++p) {
      PipelineSpec ps;
      ps.micro_batch = mbs[p];
      for (size_t k = 0; k < pipes[p].size(); ++k)
        ps.stages.push_back({splits[p][k], gtp[pipes[p][k]], c.types[gtype[pipes[p][k]]].name});
      pls.push_back(ps);
    }
    auto l = Layout::from_pipelines(pls, 0);
    ASSERT_TRUE(l.ok()) << l.status().message();
    std::vector<int> place(l->world_size());
    for (size_t p = 0; p < pipes.size(); ++p)
      for (size_t k = 0; k < pipes[p].size(); ++k)
        for (int j = 0; j < gtp[pipes[p][k]]; ++j) place[l->rank_of(k, p, j)] = groups[pipes[p][k]][j];
    auto cost = evaluate(m, c, *l, PlanOptions{G, s, place, cal});
    if (!cost.ok()) return;  // micro-batches not dividing the batch
    if (cost->feasible) best = std::min(best, cost->step_time_s);
  }
  void splits_of(const std::vector<std::vector<int>>& pipes, size_t p, std::vector<std::vector<int>>& sp, const std::vector<int>& mbs) {
    if (p == pipes.size()) return eval_layout(pipes, sp, mbs);
    std::vector<int> cur;
    std::function<void(int, int)> rec = [&](int left, int parts) {
      if (parts == 0) {
        if (left == 0) sp[p] = cur, splits_of(pipes, p + 1, sp, mbs);
        return;
      }
      for (int n = 1; n <= left - parts + 1; ++n) cur.push_back(n), rec(left - n, parts - 1), cur.pop_back();
    };
    rec(static_cast<int>(m.layers), static_cast<int>(pipes[p].size()));
  }
  void mbs_of(const std::vector<std::vector<int>>& pipes) {
    const size_t P = pipes.size();
    std::vector<int> mb(P, 1);
    std::function<void(size_t)> rec = [&](size_t p) {
      if (p == P) {
        int64_t sum = 0;
        for (int x : mb) sum += x;
        if (G % sum == 0) {
          std::vector<std::vector<int>> sp(P);
          splits_of(pipes, 0, sp, mb);
        }
        return;
      }
      for (int b = 1; b <= G; ++b) mb[p] = b, rec(p + 1);
    };
    rec(0);
  }
  void arrangements(size_t next, std::vector<std::vector<int>>& cur) {
    if (next == groups.size()) {
      for (auto& p : cur)
        if (static_cast<int64_t>(p.size()) > m.layers) return;
      return mbs_of(cur);
    }
    cur.push_back({static_cast<int>(next)});
    arrangements(next + 1, cur);
    cur.pop_back();
    for (size_t p = 0; p < cur.size(); ++p)
      for (size_t pos = 0; pos <= cur[p].size(); ++pos) {
        cur[p].insert(cur[p].begin() + pos, static_cast<int>(next));
        arrangements(next + 1, cur);
        cur[p].erase(cur[p].begin() + pos);
      }
  }
  void run() {
    std::vector<int> types;
    for (int t : c.rank_type)
      if (std::find(types.begin(), types.end(), t) == types.end()) types.push_back(t);
    std::sort(types.begin(), types.end());
    std::vector<int> tp(types.size(), 1);
    std::function<void(size_t)> rec = [&](size_t i) {
      if (i == types.size()) {
        groups.clear(), gtype.clear(), gtp.clear();
        for (size_t k = 0; k < types.size(); ++k) {
          std::map<int, std::vector<int>> per_node;
          for (int r = 0; r < c.world_size(); ++r)
            if (c.rank_type[r] == types[k]) per_node[c.node_of(r)].push_back(r);
          for (auto& [n, rs] : per_node) {
            if (rs.size() % tp[k]) return;
            for (size_t a = 0; a < rs.size(); a += tp[k])
              groups.push_back(std::vector<int>(rs.begin() + a, rs.begin() + a + tp[k])), gtype.push_back(types[k]), gtp.push_back(tp[k]);
          }
        }
        std::vector<std::vector<int>> cur;
        return arrangements(0, cur);
      }
      for (int t = 1; t <= 4; ++t)
        if (m.heads % t == 0 && m.kv_heads % t == 0 && m.ffn % t == 0) tp[i] = t, rec(i + 1);
    };
    rec(0);
  }
};

Cluster random_cluster(std::mt19937& rng, int devices, int ntypes) {
  Cluster c;
  for (int t = 0; t < ntypes; ++t) {
    DeviceType d;
    d.name = std::string(1, char('A' + t));
    d.memory_bytes = (uint64_t{1} << 20) * (2 + rng() % 14);
    d.peak_flops = 1e11 * (1 + rng() % 9);
    d.link_bytes_per_s = 1e9 * (1 + rng() % 20);
    d.dtype = rng() % 2 ? "bf16" : "fp32";
    c.types.push_back(d);
  }
  const int nodes = 1 + static_cast<int>(rng() % 2);
  for (int r = 0; r < devices; ++r) c.rank_type.push_back(static_cast<int>(rng() % ntypes));
  std::sort(c.rank_type.begin(), c.rank_type.end());
  if (nodes == 2) {
    c.topology = true;
    const int cut = 1 + static_cast<int>(rng() % (devices - 1));
    c.nodes = {{"n0", 0, cut, {}}, {"n1", cut, devices - cut, {}}};
    for (int r = 0; r < devices; ++r) c.rank_node.push_back(r < cut ? 0 : 1);
    c.inter_node = {1e9 * (1 + rng() % 4), 2e-5};
  }
  return c;
}

TEST(PlanSearch, EqualsBruteForceOnRandomSmallClusters) {
  std::mt19937 rng(2026);
  const ModelSpec m{4, 64, 128, 4, 2, 16, 256, false};
  int compared = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int devices = 2 + static_cast<int>(rng() % 3), ntypes = 2 + static_cast<int>(rng() % 2);
    Cluster c = random_cluster(rng, devices, ntypes);
    const int64_t G = 2 + static_cast<int64_t>(rng() % 3), s = 32 * (1 + static_cast<int64_t>(rng() % 4));
    // Every other trial with calibrated terms (concurrency, TP all-reduce, per-micro-batch and
    // pipeline-message costs): the search's bound and split must stay exact with them.
    CostCalibration cal;
    if (trial % 2) {
      cal.concurrency = {1.0, 0.8, 0.6, 0.5};
      cal.allreduce_latency_s = 1e-5 * static_cast<double>(rng() % 50);
      cal.allreduce_bytes_per_s = 1e9 * static_cast<double>(1 + rng() % 5);
      cal.micro_batch_overhead_s = 1e-4 * static_cast<double>(rng() % 50);
      cal.p2p_latency_s = 1e-5 * static_cast<double>(rng() % 50);
    }
    Brute bf{m, c, G, s, 1e300, {}, {}, {}, cal};
    bf.run();
    SearchOptions o;
    o.global_batch = G, o.seq_len = s, o.top = 1, o.allow_zero = false, o.exhaustive_groups = 8;
    o.calibration = cal;
    auto r = search_layouts(m, c, o);
    if (bf.best >= 1e300) {
      EXPECT_FALSE(r.ok()) << "trial " << trial;
      continue;
    }
    ASSERT_TRUE(r.ok()) << "trial " << trial << ": " << r.status().message();
    EXPECT_NEAR(r->best[0].cost.step_time_s / bf.best, 1.0, 1e-9) << "trial " << trial << ": " << r->best[0].layout.to_string();
    ++compared;
  }
  EXPECT_GE(compared, 20);
}

ModelSpec example_model() { return ModelSpec{6, 512, 1024, 8, 4, 64, 256, false}; }

Cluster three_types(double fa, double fb, double fc, uint64_t ma, uint64_t mb, uint64_t mc) {
  Cluster c;
  c.types = {{"A", "", ma, fa, 1e15, "bf16", 1, ""}, {"B", "", mb, fb, 1e15, "bf16", 1, ""}, {"C", "", mc, fc, 1e15, "bf16", 1, ""}};
  c.rank_type = {0, 1, 2};
  c.intra_node = {1e15, 0};
  return c;
}

TEST(PlanSearch, WorkedExampleDataParallelMicroBatches321) {
  // Speeds 3 : 2 : 1, memory for everything: three replicas, micro-batches proportional to speed.
  Cluster c = three_types(3e13, 2e13, 1e13, uint64_t{64} << 30, uint64_t{64} << 30, uint64_t{64} << 30);
  SearchOptions o;
  o.global_batch = 6, o.seq_len = 256;
  auto r = search_layouts(example_model(), c, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const Layout& l = r->best[0].layout;
  ASSERT_EQ(l.num_pipelines(), 3) << l.to_string();
  std::map<std::string, int> mb;
  for (int p = 0; p < 3; ++p) mb[l.stage_device(p, 0)] = l.pipeline_micro_batch(p);
  EXPECT_EQ(mb, (std::map<std::string, int>{{"A", 3}, {"B", 2}, {"C", 1}})) << l.to_string();
}

TEST(PlanSearch, WorkedExamplePipelineSplit123MemoryRichFirst) {
  // A fast (3), B (2), C slow (1) but memory-rich: no device holds the whole model, no two hold it
  // with B left over: one pipeline; layers follow speed, C (memory-rich, most activations in
  // flight) first, A last with the head.
  const ModelSpec m = example_model();
  const uint64_t layer = static_cast<uint64_t>(m.layer_split_params() + m.layer_norm_params()) * 16;
  const uint64_t emb = static_cast<uint64_t>(m.vocab * m.hidden) * 16;
  Cluster c = three_types(3e13, 2e13, 1e13, 4 * layer + emb + (64u << 20), 3 * layer + (64u << 20), 5 * layer + emb + (64u << 20));
  SearchOptions o;
  o.global_batch = 8, o.seq_len = 256;
  auto r = search_layouts(m, c, o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const Layout& l = r->best[0].layout;
  ASSERT_EQ(l.num_pipelines(), 1) << l.to_string();
  ASSERT_EQ(l.num_stages(0), 3) << l.to_string();
  EXPECT_EQ(l.stage_device(0, 0), "C") << l.to_string();
  EXPECT_EQ(l.stage_device(0, 1), "B") << l.to_string();
  EXPECT_EQ(l.stage_device(0, 2), "A") << l.to_string();
  EXPECT_EQ((std::vector<int>{l.stage_layers(0, 0), l.stage_layers(0, 1), l.stage_layers(0, 2)}), (std::vector<int>{1, 2, 3}));
}

TEST(PlanSearch, NothingFitsSaysWhatAndByHowMuch) {
  const ModelSpec m = example_model();
  Cluster c = three_types(3e13, 2e13, 1e13, 8u << 20, 8u << 20, 8u << 20);
  SearchOptions o;
  o.global_batch = 4, o.seq_len = 64;
  auto r = search_layouts(m, c, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), "PlanInfeasible");
  EXPECT_NE(r.status().message().find("no layout of the search space fits"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("over by"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("short by"), std::string::npos) << r.status().message();
  c.types[1].peak_flops = 0;
  auto z = search_layouts(m, c, o);
  ASSERT_FALSE(z.ok());
  EXPECT_NE(z.status().message().find("'B' has no peak_flops"), std::string::npos) << z.status().message();
}

}  // namespace plan_search_test
}  // namespace ckpt::trainer
