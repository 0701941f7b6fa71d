// Property test of the resharding engine on the real native store (HDF5 shards + manifest):
// at least 200 random (LLaMA config, layout A, layout B) triples, tp in {1,2,3,4,8} where the model
// allows, pp 1..L with random uneven splits, dp in {1,2,4}, zero 0/1, GQA, vocab not divisible by
// tp, tied/untied, biases, bf16 weights with fp32 master weights and Adam moments.
//   - A -> B -> A gives a byte-identical checkpoint: manifest.json (every piece's file, dataset,
//     region, sha256) and every HDF5 shard file byte for byte; A2's stored bytes re-hash to the
//     manifest's checksums;
//   - every stored piece of B holds exactly the elements a naive index computation takes from the
//     global tensors (written out here, independent of the engine), so B's global view is A's;
//   - ckpt::diff_sources(A, B) reports every tensor identical;
//   - impossible layouts (tp not dividing heads, an empty stage, more stages than layers) are
//     refused by make_plan before anything is written.
// CKPT_LONG=1 runs 1000 triples instead of 120 (30 under AddressSanitizer; the general layouts of reshard_hetero_property_test.cc add 24 more).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "converters/model/llama_config.h"
#include "converters/model/llama_sharding.h"
#include "formats/store/store_reader.h"
#include "reshard/diff.h"
#include "reshard/memory_io.h"
#include "reshard/planner.h"
#include "reshard/store_reshard.h"
#include "tests/converters/random_model.h"
#include "tests/naive_region.h"
#include "tests/temp_dir.h"
#include "tests/test_cases.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using namespace testing_prop;

Layout random_layout(std::mt19937& rng, const LlamaConfig& c, const std::vector<int>& tps) {
  const int L = static_cast<int>(c.num_hidden_layers);
  const int tp = tps[rng() % tps.size()];
  const int pp = 1 + static_cast<int>(rng() % L);
  // Random composition of L into pp positive parts: pp-1 distinct cut points in 1..L-1.
  std::vector<int> cuts;
  for (int i = 1; i < L; ++i) cuts.push_back(i);
  std::shuffle(cuts.begin(), cuts.end(), rng);
  cuts.resize(static_cast<size_t>(pp - 1));
  std::sort(cuts.begin(), cuts.end());
  std::vector<int> per;
  int prev = 0;
  for (int x : cuts) {
    per.push_back(x - prev);
    prev = x;
  }
  per.push_back(L - prev);
  const int dps[] = {1, 2, 4};
  int dp = dps[rng() % 3];
  while (dp > 1 && tp * pp * dp > 32) dp /= 2;  // keeps the test fast: at most 32 shard files
  auto l = Layout::make(tp, pp, dp, static_cast<int>(rng() % 2), L, per);
  EXPECT_TRUE(l.ok()) << l.status().to_string();
  Layout out = *l;
  const int64_t divisors[] = {1, 2, 3, 8, 128};
  out.vocab_divisor = divisors[rng() % 5];
  if (rng() % 3 == 0) {
    out.micro_batch.clear();
    for (int d = 0; d < out.dp; ++d) out.micro_batch.push_back(1 + static_cast<int>(rng() % 3));
  }
  return out;
}

using testing_ref::naive_extract;

using ReshardProperty = ckpt::testing::TempDirTest;

TEST_F(ReshardProperty, RandomLayoutPairsRoundTripByteIdentical) {
  const int cases = ckpt::testing::property_cases(64, 1000, 4);
  std::mt19937 rng(20261123);
  std::map<int, int> tp_seen;
  int zero_seen[2] = {0, 0}, tied_seen[2] = {0, 0}, gqa = 0, vocab_not_div = 0, uneven = 0;
  for (int c = 0; c < cases; ++c) {
    Model m = random_model(rng, symmetric_ranges());
    const auto tps = allowed_tps(m.cfg, {1, 2, 3, 4, 8});
    ASSERT_FALSE(tps.empty());
    const Layout A = random_layout(rng, m.cfg, tps), B = random_layout(rng, m.cfg, tps);
    const std::string what = "case " + std::to_string(c) + ": A " + A.to_string() + " div " +
                             std::to_string(A.vocab_divisor) + ", B " + B.to_string() + " div " +
                             std::to_string(B.vocab_divisor) + ", config " + m.cfg.to_json().dump();
    for (const Layout* l : {&A, &B}) {
      ++tp_seen[l->tp];
      ++zero_seen[l->zero];
      if (m.cfg.vocab_size % l->tp) ++vocab_not_div;
      if (l->num_layers() % l->pp) ++uneven;
    }
    ++tied_seen[m.cfg.tie_word_embeddings];
    if (m.cfg.num_key_value_heads < m.cfg.num_attention_heads) ++gqa;

    // The global model as one whole piece per tensor.
    MemoryCheckpoint g;
    g.tensors = m.tensors;
    for (size_t i = 0; i < m.tensors.size(); ++i) g.pieces.push_back({m.tensors[i].name, Region{Box::whole(m.tensors[i].shape)}, m.tensors[i].dtype});
    g.data = m.global;
    g.metadata = {{"model_config", m.cfg.to_json()}};
    MemorySource global(std::move(g), "global");

    const fs::path dir = root_ / std::to_string(c);
    const std::string a = dir / "A", b = dir / "B", a2 = dir / "A2";
    ASSERT_TRUE(fs::create_directories(dir));
    {
      Status st = reshard_to(global, m.cfg, A, a, random_exec(rng, 3, {200, 4096, 64ull << 20}));
      ASSERT_TRUE(st.ok()) << what << ": global -> A: " << st.to_string();
    }
    auto ra = store::StoreReader::open(a);
    ASSERT_TRUE(ra.ok()) << what << ra.status().to_string();
    {
      Status st = reshard_to(**ra, m.cfg, B, b, random_exec(rng, 3, {200, 4096, 64ull << 20}));
      ASSERT_TRUE(st.ok()) << what << ": A -> B: " << st.to_string();
    }
    {
      auto rb = store::StoreReader::open(b);
      ASSERT_TRUE(rb.ok()) << what << rb.status().to_string();
      // Every piece of B holds what the naive index computation takes from the global tensors.
      std::map<std::string, size_t> ti;
      for (size_t i = 0; i < m.tensors.size(); ++i) ti[m.tensors[i].name] = i;
      ASSERT_EQ((*rb)->tensors(), m.tensors) << what;
      std::vector<uint8_t> buf;
      for (size_t p = 0; p < (*rb)->pieces().size(); ++p) {
        const Piece& piece = (*rb)->pieces()[p];
        const size_t t = ti.at(piece.tensor);
        ASSERT_EQ(piece.dtype, m.tensors[t].dtype) << what;
        buf.assign(static_cast<size_t>(piece.region.numel()) * dtype_size(piece.dtype), 0);
        Status st = (*rb)->read_storage_range(p, 0, piece.region.numel(), buf.data());
        ASSERT_TRUE(st.ok()) << what << st.to_string();
        ASSERT_EQ(buf, naive_extract(m.global[t], m.tensors[t].shape, piece.region, dtype_size(piece.dtype)))
            << what << ": B piece " << p << " " << piece.tensor << " " << piece.region.to_string();
      }
      // The layout recorded in B is B.
      auto lb = Layout::from_json((*rb)->metadata().at("layout"));
      ASSERT_TRUE(lb.ok()) << lb.status().to_string();
      EXPECT_EQ(lb->stage_of_layer, B.stage_of_layer) << what;
      EXPECT_EQ(lb->micro_batch, B.micro_batch) << what;
      EXPECT_EQ(lb->vocab_divisor, B.vocab_divisor) << what;
      // Global views agree (through the engine's diff).
      auto rep = diff_sources(**ra, **rb, DiffOptions{});
      ASSERT_TRUE(rep.ok()) << what << rep.status().to_string();
      ASSERT_TRUE(rep->equal()) << what << "\n" << rep->to_text();
      for (const auto& td : rep->tensors) ASSERT_EQ(td.kind, TensorDiffKind::kIdentical) << what << " " << td.name;
      Status st = reshard_to(**rb, m.cfg, A, a2, random_exec(rng, 3, {200, 4096, 64ull << 20}));
      ASSERT_TRUE(st.ok()) << what << ": B -> A: " << st.to_string();
    }
    // A -> B -> A: the same manifest byte for byte (every piece's file, dataset, region, dtype,
    // sha256), and A2's stored bytes hash to it.
    ASSERT_EQ(slurp(a + "/manifest.json"), slurp(a2 + "/manifest.json")) << what;
    ra->reset();
    if (c % 4 == 0) {  // (every 4th case: the re-hash costs more than the rest of a case)
      auto r2 = store::StoreReader::open(a2);
      ASSERT_TRUE(r2.ok());
      auto vr = (*r2)->verify();
      ASSERT_TRUE(vr.ok()) << what << ": " << vr.failures.front().status.to_string();
    }
    {
      std::set<std::string> files_a, files_a2;
      for (auto& e : fs::directory_iterator(a + "/shards")) files_a.insert(e.path().filename());
      for (auto& e : fs::directory_iterator(a2 + "/shards")) files_a2.insert(e.path().filename());
      ASSERT_EQ(files_a, files_a2) << what;
      for (const std::string& f : files_a)  // HDF5 files byte for byte (no timestamps stored)
        ASSERT_TRUE(slurp(a + "/shards/" + f) == slurp(a2 + "/shards/" + f)) << what << ": shards/" << f << " differs";
    }
    EXPECT_FALSE(fs::exists(a + ".partial") || fs::exists(b + ".partial") || fs::exists(a2 + ".partial")) << what;
    fs::remove_all(dir);
  }
  // The generator reached every corner the header comment names.
  const int k = cases / 10;
  for (int tp : {1, 2, 3, 4, 8}) EXPECT_GE(tp_seen[tp], k / 4) << "tp=" << tp << " drawn too rarely";
  EXPECT_GE(zero_seen[0], k);
  EXPECT_GE(zero_seen[1], k);
  EXPECT_GE(tied_seen[0], k);
  EXPECT_GE(tied_seen[1], k);
  EXPECT_GE(gqa, k);
  EXPECT_GE(vocab_not_div, k);
  EXPECT_GE(uneven, k);
}

TEST_F(ReshardProperty, ImpossibleLayoutsRefusedBeforeAnyWrite) {
  std::mt19937 rng(7);
  int refused = 0;
  for (int c = 0; c < 40; ++c) {
    Model m = random_model(rng, symmetric_ranges());
    LlamaShardingRules rules(m.cfg);
    MemoryCheckpoint g;
    g.tensors = m.tensors;
    for (size_t i = 0; i < m.tensors.size(); ++i) g.pieces.push_back({m.tensors[i].name, Region{Box::whole(m.tensors[i].shape)}, m.tensors[i].dtype});
    g.data = m.global;
    const int L = static_cast<int>(m.cfg.num_hidden_layers);
    std::vector<std::pair<std::string, Layout>> bad;
    // tp not dividing the heads.
    for (int tp : {3, 5, 6, 7, 16})
      if (m.cfg.num_attention_heads % tp != 0) {
        Layout l;
        l.tp = tp;
        l.stage_of_layer.assign(static_cast<size_t>(L), 0);
        bad.push_back({"num_attention_heads", l});
        break;
      }
    // An empty stage (stage 1 of 3 holds nothing).
    if (L >= 3) {
      Layout l;
      l.pp = 3;
      l.stage_of_layer.assign(static_cast<size_t>(L), 0);
      l.stage_of_layer.back() = 2;
      bad.push_back({"holds no layer", l});
    }
    // More stages than layers.
    {
      Layout l;
      l.pp = L + 1;
      for (int i = 0; i < L; ++i) l.stage_of_layer.push_back(i);
      bad.push_back({"pipeline stages for only", l});
      auto made = Layout::make(1, L + 1, 1, 0, L);
      ASSERT_FALSE(made.ok());
      EXPECT_NE(made.status().message().find("pipeline stages for only"), std::string::npos) << made.status().to_string();
    }
    // Layer count that is not the model's.
    {
      Layout l;
      l.stage_of_layer.assign(static_cast<size_t>(L + 1), 0);
      bad.push_back({"num_hidden_layers", l});
    }
    for (const auto& [needle, l] : bad) {
      MemorySource src(g, "global");
      auto plan = make_plan(src.tensors(), src.pieces(), {}, l, rules);
      ASSERT_FALSE(plan.ok()) << needle << " " << l.to_string();
      EXPECT_EQ(plan.status().kind(), ErrorKind::kInvalidArgument) << plan.status().to_string();
      EXPECT_NE(plan.status().message().find(needle), std::string::npos) << plan.status().to_string();
      EXPECT_EQ(src.reads(), 0u);  // refused from metadata alone
      ++refused;
    }
  }
  EXPECT_GE(refused, 120);
}

}  // namespace
}  // namespace ckpt
