// Balanced de-duplication of place_tensors (reshard/planner.h), judged by a naive oracle:
// every element of every tensor is stored exactly once; each stored piece's rank really holds it
// (rank_view of that rank, element by element); a dp=4 zero-0 layout of a LLaMA-shaped config
// spreads the bytes so that the largest shard file is within 25% of the mean (the lowest-rank
// rule put everything on DP rank 0); the same input gives the same assignment.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "converters/model/llama_config.h"
#include "converters/model/llama_sharding.h"
#include "reshard/planner.h"
#include "tests/naive_region.h"
#include "tests/test_cases.h"

namespace ckpt {
namespace {

LlamaConfig balance_llama(int64_t kv_heads, bool tied) {
  LlamaConfig c;
  c.vocab_size = 250;
  c.hidden_size = 64;
  c.intermediate_size = 160;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 8;
  c.num_key_value_heads = kv_heads;
  c.head_dim = 8;
  c.tie_word_embeddings = tied;
  return c;
}

// The trainer checkpoint's tensors (trainer_tensors: params, then the two Adam moments), F32.
std::vector<TensorMeta> balance_tensors(const LlamaConfig& c) {
  std::vector<TensorMeta> params = llama_model_tensors(c, DType::kF32), out = params;
  for (const char* prefix : {"optimizer.exp_avg.", "optimizer.exp_avg_sq."})
    for (const TensorMeta& t : params) out.push_back({prefix + t.name, DType::kF32, t.shape});
  return out;
}

// Checks every property but balance; returns bytes per rank.
std::vector<uint64_t> balance_check(const LlamaConfig& cfg, const Layout& layout) {
  const std::vector<TensorMeta> ts = balance_tensors(cfg);
  LlamaShardingRules rules(cfg);
  auto placed = place_tensors(ts, layout, rules);
  EXPECT_TRUE(placed.ok()) << placed.status().to_string();
  if (!placed.ok()) return {};
  // What each rank holds: tensor name -> set of global indices.
  std::vector<std::map<std::string, std::set<int64_t>>> held(static_cast<size_t>(layout.world_size()));
  for (int r = 0; r < layout.world_size(); ++r) {
    auto view = rank_view(ts, layout, rules, r);
    EXPECT_TRUE(view.ok());
    std::map<std::string, Shape> shape_of;
    for (const TensorMeta& t : ts) shape_of[t.name] = t.shape;
    for (const Piece& p : *view)
      for (int64_t g : testing_ref::naive_indices(shape_of[p.tensor], p.region)) held[static_cast<size_t>(r)][p.tensor].insert(g);
  }
  std::vector<uint64_t> bytes(static_cast<size_t>(layout.world_size()), 0);
  for (size_t i = 0; i < ts.size(); ++i) {
    int64_t n = 1;
    for (int64_t e : ts[i].shape) n *= e;
    std::vector<int> count(static_cast<size_t>(n), 0);
    for (const RankRegion& rr : (*placed)[i]) {
      const std::set<int64_t>& mine = held[static_cast<size_t>(rr.rank)][ts[i].name];
      for (int64_t g : testing_ref::naive_indices(ts[i].shape, rr.region)) {
        ++count[static_cast<size_t>(g)];
        EXPECT_TRUE(mine.count(g)) << ts[i].name << " element " << g << " written by rank " << rr.rank
                                   << " which does not hold it";
      }
      bytes[static_cast<size_t>(rr.rank)] += static_cast<uint64_t>(rr.region.numel()) * 4;
    }
    for (int64_t g = 0; g < n; ++g)
      if (count[static_cast<size_t>(g)] != 1) {
        ADD_FAILURE() << ts[i].name << " element " << g << " stored " << count[static_cast<size_t>(g)] << " times";
        return bytes;
      }
  }
  return bytes;
}

TEST(PlannerBalance, EachElementOnceByAHolder) {
  struct Case {
    int64_t kv;
    bool tied;
    int tp, pp, dp, zero;
  };
  const std::vector<Case> cases = {Case{2, true, 4, 2, 2, 1}, Case{8, false, 2, 2, 2, 0}, Case{2, true, 2, 1, 3, 1},
                                   Case{1, true, 2, 2, 1, 0}, Case{4, false, 1, 3, 2, 1}};
  const int n = ckpt::testing::property_cases(static_cast<int>(cases.size()), static_cast<int>(cases.size()), 2);
  for (const Case& c : std::vector<Case>(cases.begin(), cases.begin() + n)) {
    SCOPED_TRACE("tp " + std::to_string(c.tp) + " pp " + std::to_string(c.pp) + " dp " + std::to_string(c.dp) +
                 " zero " + std::to_string(c.zero));
    const LlamaConfig cfg = balance_llama(c.kv, c.tied);
    auto layout = Layout::make(c.tp, c.pp, c.dp, c.zero, static_cast<int>(cfg.num_hidden_layers));
    ASSERT_TRUE(layout.ok());
    balance_check(cfg, *layout);
  }
}

TEST(PlannerBalance, DataParallelZero0WithinQuarterOfMean) {
  const LlamaConfig cfg = balance_llama(4, false);
  auto layout = Layout::make(1, 1, 4, 0, static_cast<int>(cfg.num_hidden_layers));
  ASSERT_TRUE(layout.ok());
  std::vector<uint64_t> bytes = balance_check(cfg, *layout);
  ASSERT_EQ(bytes.size(), 4u);
  uint64_t total = 0, mx = 0;
  for (uint64_t b : bytes) {
    total += b;
    mx = std::max(mx, b);
  }
  const double mean = static_cast<double>(total) / 4;
  EXPECT_LE(static_cast<double>(mx), 1.25 * mean) << "largest " << mx << " mean " << mean;
  for (uint64_t b : bytes) EXPECT_GT(b, 0u);  // every replica takes part
}

TEST(PlannerBalance, Deterministic) {
  const LlamaConfig cfg = balance_llama(2, true);
  auto layout = Layout::make(2, 2, 2, 1, static_cast<int>(cfg.num_hidden_layers));
  ASSERT_TRUE(layout.ok());
  const std::vector<TensorMeta> ts = balance_tensors(cfg);
  LlamaShardingRules rules(cfg);
  auto a = place_tensors(ts, *layout, rules), b = place_tensors(ts, *layout, rules);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->size(), b->size());
  for (size_t i = 0; i < a->size(); ++i) {
    ASSERT_EQ((*a)[i].size(), (*b)[i].size());
    for (size_t k = 0; k < (*a)[i].size(); ++k) {
      EXPECT_EQ((*a)[i][k].rank, (*b)[i][k].rank);
      EXPECT_EQ((*a)[i][k].region, (*b)[i][k].region);
    }
  }
}

}  // namespace
}  // namespace ckpt
