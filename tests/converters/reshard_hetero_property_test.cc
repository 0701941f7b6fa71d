// Property test of the resharding engine between general (heterogeneous) layouts, on the real
// native store, in the style of reshard_property_test.cc: random small LLaMA configs (GQA, tied and
// untied embeddings, biases, bf16 weights with fp32 master weights and Adam moments) and random
// general layouts (1-3 pipelines, each with its own stage split, micro-batch and per-stage tp
// dividing the heads, KV heads and ffn; device names; ZeRO-1 only over uniform pipelines):
//   - A -> B -> A gives a byte-identical checkpoint (manifest.json and every HDF5 shard file);
//   - every stored piece of B holds exactly the elements a naive index computation takes from the
//     global tensors (tests/naive_region.h), and diff_sources(A, B) reports every tensor identical;
//   - B's plan stores every element exactly once, each by a rank that holds it (rank_view, element
//     by element) and can copy it out of one held region (copy_from_held), and under ZeRO-1 every rank's optimizer holdings are the DP range of the
//     trainer's zero_buffer(tensors, stage_view(p, s), ...) buffers;
//   - a general layout that only names device types plans exactly as its symmetric form;
//   - bad general layouts are refused before anything is read, naming the pipeline stage; the
//     Megatron layout refuses the general form.
// CKPT_LONG=1 runs 400 pairs instead of 24.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "converters/megatron/megatron_segments.h"
#include "converters/model/llama_config.h"
#include "converters/model/llama_sharding.h"
#include "formats/store/store_reader.h"
#include "reshard/diff.h"
#include "reshard/layout/holdings.h"
#include "reshard/layout/zero_layout.h"
#include "reshard/memory_io.h"
#include "reshard/planner.h"
#include "reshard/store_reshard.h"
#include "tests/converters/random_model.h"
#include "tests/naive_region.h"
#include "tests/temp_dir.h"
#include "tests/test_cases.h"

namespace ckpt {
namespace hetero_property {  // named: unique beside reshard_property_test.cc in a unity batch

namespace fs = std::filesystem;
using namespace testing_prop;
using testing_ref::naive_extract;

// A random composition of L layers into 1..min(L, 3) stages, each at a random allowed tp.
std::vector<StageSpec> random_stages(std::mt19937& rng, int L, const std::vector<int>& tps) {
  const int k = 1 + static_cast<int>(rng() % static_cast<unsigned>(std::min(L, 3)));
  std::vector<int> cuts;
  for (int i = 1; i < L; ++i) cuts.push_back(i);
  std::shuffle(cuts.begin(), cuts.end(), rng);
  cuts.resize(static_cast<size_t>(k - 1));
  std::sort(cuts.begin(), cuts.end());
  cuts.push_back(L);
  std::vector<StageSpec> out;
  const char* devices[] = {"", "A", "B"};
  int prev = 0;
  for (int x : cuts) {
    out.push_back({x - prev, tps[rng() % tps.size()], devices[rng() % 3]});
    prev = x;
  }
  return out;
}

// Random pipelines (uniform ones a third of the time, then zero 0 or 1), at most 12 ranks.
Layout random_general(std::mt19937& rng, const LlamaConfig& c, const std::vector<int>& tps) {
  const int L = static_cast<int>(c.num_hidden_layers);
  while (true) {
    const int np = 1 + static_cast<int>(rng() % 3);
    const bool uniform = rng() % 3 == 0;
    std::vector<PipelineSpec> pls;
    for (int p = 0; p < np; ++p) {
      PipelineSpec pl{1 + static_cast<int>(rng() % 3), random_stages(rng, L, tps)};
      if (uniform && p > 0) {
        std::vector<StageSpec> same = pls[0].stages;
        for (size_t s = 0; s < same.size(); ++s) same[s].device = (rng() % 2) ? "B" : "";
        pl.stages = same;
      }
      pls.push_back(std::move(pl));
    }
    const int64_t divisors[] = {1, 2, 8, 128};
    // Drawn in sequence (a call's arguments are evaluated in an unspecified order: g++ and clang
    // differ), in g++'s order, so both compilers test the same layouts.
    const int64_t divisor = divisors[rng() % 4];
    const int zero = uniform ? static_cast<int>(rng() % 2) : 0;
    auto l = Layout::from_pipelines(pls, zero, divisor);
    EXPECT_TRUE(l.ok()) << l.status().to_string();
    if (l.ok() && l->world_size() <= 12) return *l;
  }
}

MemoryCheckpoint global_checkpoint(const Model& m) {
  MemoryCheckpoint g;
  g.tensors = m.tensors;
  for (const TensorMeta& t : m.tensors) g.pieces.push_back({t.name, Region{Box::whole(t.shape)}, t.dtype});
  g.data = m.global;
  g.metadata = {{"model_config", m.cfg.to_json()}};
  return g;
}

// place_tensors(layout) stores every element once, each by a rank whose rank_view holds it.
void check_assignment(const Model& m, const Layout& layout, const std::string& what) {
  LlamaShardingRules rules(m.cfg);
  auto placed = place_tensors(m.tensors, layout, rules);
  ASSERT_TRUE(placed.ok()) << what << placed.status().to_string();
  std::map<std::string, size_t> ti;
  for (size_t i = 0; i < m.tensors.size(); ++i) ti[m.tensors[i].name] = i;
  std::vector<std::vector<std::set<int64_t>>> held(static_cast<size_t>(layout.world_size()),
                                                   std::vector<std::set<int64_t>>(m.tensors.size()));
  std::vector<std::vector<Piece>> views;
  for (int r = 0; r < layout.world_size(); ++r) {
    auto view = rank_view(m.tensors, layout, rules, r);
    ASSERT_TRUE(view.ok()) << what << view.status().to_string();
    for (const Piece& p : *view) {
      const size_t i = ti.at(p.tensor);
      for (int64_t g : testing_ref::naive_indices(m.tensors[i].shape, p.region)) held[static_cast<size_t>(r)][i].insert(g);
    }
    views.push_back(std::move(view).value());
  }
  // The writer can copy each of its pieces out of one region it holds (copy_from_held, what a
  // trainer's save does), giving the piece's elements.
  for (size_t i = 0; i < m.tensors.size(); ++i)
    for (const RankRegion& rr : (*placed)[i]) {
      const size_t es = dtype_size(m.tensors[i].dtype);
      const auto want = naive_extract(m.global[i], m.tensors[i].shape, rr.region, es);
      bool copied = false;
      for (const Piece& h : views[static_cast<size_t>(rr.rank)]) {
        if (h.tensor != m.tensors[i].name || copied) continue;
        const auto held_bytes = naive_extract(m.global[i], m.tensors[i].shape, h.region, es);
        std::vector<uint8_t> got(want.size());
        copied = copy_from_held(h.region, held_bytes.data(), rr.region, got.data(), es);
        if (copied) {
          ASSERT_EQ(got, want) << what << ": copy_from_held of " << m.tensors[i].name << " " << rr.region.to_string();
        }
      }
      ASSERT_TRUE(copied) << what << ": rank " << rr.rank << " cannot copy out " << m.tensors[i].name << " "
                          << rr.region.to_string();
    }
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    int64_t n = 1;
    for (int64_t e : m.tensors[i].shape) n *= e;
    std::vector<int> count(static_cast<size_t>(n), 0);
    for (const RankRegion& rr : (*placed)[i])
      for (int64_t g : testing_ref::naive_indices(m.tensors[i].shape, rr.region)) {
        ++count[static_cast<size_t>(g)];
        ASSERT_TRUE(held[static_cast<size_t>(rr.rank)][i].count(g))
            << what << ": " << m.tensors[i].name << " element " << g << " written by rank " << rr.rank
            << " which does not hold it";
      }
    for (int64_t g = 0; g < n; ++g)
      ASSERT_EQ(count[static_cast<size_t>(g)], 1) << what << ": " << m.tensors[i].name << " element " << g;
  }
}

// Under ZeRO-1: each rank's optimizer holdings (rank_view) are its DP range of the buffers the
// trainer computes with zero_buffer(tensors, layout.stage_view(p, s), rules, s, t, kind).
void check_zero_buffers(const Model& m, const Layout& layout, const std::string& what) {
  LlamaShardingRules rules(m.cfg);
  for (int r = 0; r < layout.world_size(); ++r) {
    const RankPlace at = layout.place_of_rank(r);
    auto view = rank_view(m.tensors, layout, rules, r);
    ASSERT_TRUE(view.ok()) << what << view.status().to_string();
    for (std::string kind : {"optimizer.exp_avg", "optimizer.exp_avg_sq", "optimizer.fp32_param"}) {
      auto zb = zero_buffer(m.tensors, layout.stage_view(at.pipeline, at.stage), rules, at.stage, at.tp_rank, kind);
      ASSERT_TRUE(zb.ok()) << what << zb.status().to_string();
      ASSERT_EQ(zb->dp, layout.num_pipelines()) << what;
      std::vector<std::pair<std::string, Region>> want, got;
      const auto [lo, hi] = zb->range(at.pipeline);
      for (const ZeroSegment& sg : zb->segments) {
        const int64_t a = std::max(lo, sg.offset) - sg.offset, b = std::min(hi, sg.offset + sg.numel) - sg.offset;
        if (a >= b) continue;
        Region reg = (a == 0 && b == sg.box.numel()) ? Region{sg.box} : Region{sg.box, a, b};
        want.push_back({m.tensors[sg.tensor].name, reg});
      }
      for (const Piece& p : *view)
        if (zero_kind(p.tensor) == kind) got.push_back({p.tensor, p.region});
      ASSERT_EQ(got, want) << what << ": rank " << r << " " << kind;
    }
  }
}

using ReshardHetero = ckpt::testing::TempDirTest;

TEST_F(ReshardHetero, RandomGeneralLayoutsRoundTripByteIdentical) {
  const int cases = ckpt::testing::property_cases(24, 400, 8);
  std::mt19937 rng(20261124);
  int general = 0, zero1 = 0, mixed_tp = 0, split_differs = 0, tied_mixed = 0;
  for (int c = 0; c < cases; ++c) {
    const Model m = random_model(rng, small_ranges());
    const auto tps = allowed_tps(m.cfg, {1, 2, 3, 4});
    const Layout A = random_general(rng, m.cfg, tps), B = random_general(rng, m.cfg, tps);
    const std::string what = "case " + std::to_string(c) + ": A " + A.to_json().dump() + ", B " + B.to_json().dump() +
                             ", config " + m.cfg.to_json().dump();
    for (const Layout* l : {&A, &B}) {
      general += !l->symmetric();
      zero1 += l->zero == 1 && !l->symmetric();
      split_differs += !l->uniform_pipelines();
      bool mixed = false;
      for (int p = 0; p < l->num_pipelines(); ++p)
        for (int s = 0; s < l->num_stages(p); ++s) mixed = mixed || l->stage_tp(p, s) != l->stage_tp(0, 0);
      mixed_tp += mixed;
      const int last = l->num_stages(0) - 1;
      tied_mixed += m.cfg.tie_word_embeddings && l->stage_tp(0, 0) != l->stage_tp(0, last);
    }
    MemorySource global(global_checkpoint(m), "global");
    const fs::path dir = root_ / std::to_string(c);
    const std::string a = dir / "A", b = dir / "B", a2 = dir / "A2";
    ASSERT_TRUE(fs::create_directories(dir));
    Status st = reshard_to(global, m.cfg, A, a, random_exec(rng, 2, {200, 64ull << 20}));
    ASSERT_TRUE(st.ok()) << what << ": global -> A: " << st.to_string();
    auto ra = store::StoreReader::open(a);
    ASSERT_TRUE(ra.ok()) << what << ra.status().to_string();
    st = reshard_to(**ra, m.cfg, B, b, random_exec(rng, 2, {200, 64ull << 20}));
    ASSERT_TRUE(st.ok()) << what << ": A -> B: " << st.to_string();
    {
      auto rb = store::StoreReader::open(b);
      ASSERT_TRUE(rb.ok()) << what << rb.status().to_string();
      ASSERT_EQ((*rb)->tensors(), m.tensors) << what;
      std::map<std::string, size_t> ti;
      for (size_t i = 0; i < m.tensors.size(); ++i) ti[m.tensors[i].name] = i;
      std::vector<uint8_t> buf;
      for (size_t p = 0; p < (*rb)->pieces().size(); ++p) {
        const Piece& piece = (*rb)->pieces()[p];
        const size_t t = ti.at(piece.tensor);
        buf.assign(static_cast<size_t>(piece.region.numel()) * dtype_size(piece.dtype), 0);
        ASSERT_TRUE((*rb)->read_storage_range(p, 0, piece.region.numel(), buf.data()).ok()) << what;
        ASSERT_EQ(buf, naive_extract(m.global[t], m.tensors[t].shape, piece.region, dtype_size(piece.dtype)))
            << what << ": B piece " << p << " " << piece.tensor << " " << piece.region.to_string();
      }
      auto lb = Layout::from_json((*rb)->metadata().at("layout"));
      ASSERT_TRUE(lb.ok()) << lb.status().to_string();
      EXPECT_EQ(lb->to_json(), B.to_json()) << what;
      auto rep = diff_sources(**ra, **rb, DiffOptions{});
      ASSERT_TRUE(rep.ok()) << what << rep.status().to_string();
      for (const auto& td : rep->tensors) ASSERT_EQ(td.kind, TensorDiffKind::kIdentical) << what << " " << td.name;
      st = reshard_to(**rb, m.cfg, A, a2, random_exec(rng, 2, {200, 64ull << 20}));
      ASSERT_TRUE(st.ok()) << what << ": B -> A: " << st.to_string();
    }
    ASSERT_EQ(slurp(a + "/manifest.json"), slurp(a2 + "/manifest.json")) << what;
    std::set<std::string> files_a, files_a2;
    for (auto& e : fs::directory_iterator(a + "/shards")) files_a.insert(e.path().filename());
    for (auto& e : fs::directory_iterator(a2 + "/shards")) files_a2.insert(e.path().filename());
    ASSERT_EQ(files_a, files_a2) << what;
    for (const std::string& f : files_a)
      ASSERT_TRUE(slurp(a + "/shards/" + f) == slurp(a2 + "/shards/" + f)) << what << ": shards/" << f << " differs";
    check_assignment(m, B, what);
    if (B.zero == 1) check_zero_buffers(m, B, what);
    if (::testing::Test::HasFatalFailure()) return;
    fs::remove_all(dir);
  }
  // The generator reached the corners named in the header comment.
  const int k = cases / 10;
  EXPECT_GE(general, cases) << "general layouts drawn too rarely";
  EXPECT_GE(zero1, k / 2 + 1);
  EXPECT_GE(mixed_tp, k);
  EXPECT_GE(split_differs, k);
  EXPECT_GE(tied_mixed, k / 2 + 1);
}

// A general layout that differs from a symmetric one only by naming device types places every
// tensor on the same ranks (same rank order) and so plans the same pieces on the same ranks.
TEST(ReshardHeteroPlan, NamedDevicesPlanAsTheSymmetricForm) {
  std::mt19937 rng(5);
  int checked = 0;
  for (int c = 0; c < 20; ++c) {
    const Model m = random_model(rng, small_ranges());
    const auto tps = allowed_tps(m.cfg, {1, 2, 3, 4});
    const int L = static_cast<int>(m.cfg.num_hidden_layers);
    const int tp = tps[rng() % tps.size()], dp = 1 + static_cast<int>(rng() % 3);
    std::vector<StageSpec> stages = random_stages(rng, L, {tp});
    for (StageSpec& st : stages) st.device = "X";
    std::vector<PipelineSpec> pls(static_cast<size_t>(dp), PipelineSpec{1, stages});
    const int zero = static_cast<int>(rng() % 2);
    auto g = Layout::from_pipelines(pls, zero, 8);
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    ASSERT_FALSE(g->symmetric());
    auto sym = g->as_symmetric("test");
    ASSERT_TRUE(sym.ok()) << sym.status().to_string();
    ASSERT_TRUE(sym->symmetric());
    MemorySource src(global_checkpoint(m), "global");
    LlamaShardingRules rules(m.cfg);
    auto pg = make_plan(src.tensors(), src.pieces(), {}, *g, rules);
    auto ps = make_plan(src.tensors(), src.pieces(), {}, *sym, rules);
    ASSERT_TRUE(pg.ok() && ps.ok()) << pg.status().to_string() << ps.status().to_string();
    EXPECT_EQ(pg->pieces, ps->pieces) << g->to_string();
    EXPECT_EQ(pg->piece_rank, ps->piece_rank) << g->to_string();
    ++checked;
  }
  EXPECT_EQ(checked, 20);
}

// Bad general layouts: refused before anything is read, the message naming where.
TEST(ReshardHeteroPlan, BadGeneralLayoutsRefused) {
  LlamaConfig c;
  c.vocab_size = 40;
  c.hidden_size = 8;
  c.intermediate_size = 16;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 2;
  Model m;
  m.cfg = c;
  m.tensors = llama_model_tensors(c, DType::kF32);
  std::mt19937 rng(1);
  for (const auto& t : m.tensors) m.global.push_back(random_values(t, rng));
  LlamaShardingRules rules(c);
  auto plan_error = [&](const Layout& l) {
    MemorySource src(global_checkpoint(m), "global");
    auto p = make_plan(src.tensors(), src.pieces(), {}, l, rules);
    EXPECT_EQ(src.reads(), 0u);
    return p.ok() ? std::string("accepted") : p.status().to_string();
  };
  // tp 3 does not divide the 4 heads on pipeline 1's stage 1.
  auto l = Layout::from_pipelines({{1, {{4, 2, "A"}}}, {1, {{1, 1, "A"}, {3, 3, "B"}}}}, 0);
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  std::string e = plan_error(*l);
  EXPECT_NE(e.find("pipeline 1 stage 1"), std::string::npos) << e;
  EXPECT_NE(e.find("num_attention_heads"), std::string::npos) << e;
  // The pipelines hold 5 layers, the model 4.
  l = Layout::from_pipelines({{1, {{2, 2, "A"}, {3, 1, ""}}}, {1, {{5, 1, ""}}}}, 0);
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  e = plan_error(*l);
  EXPECT_NE(e.find("pipeline 0 stage 0"), std::string::npos) << e;
  EXPECT_NE(e.find("num_hidden_layers"), std::string::npos) << e;
  // ZeRO-1 over pipelines whose stages differ; pipelines covering different layer counts.
  auto z = Layout::from_pipelines({{1, {{2, 2, ""}, {2, 1, ""}}}, {1, {{2, 1, ""}, {2, 1, ""}}}}, 1);
  ASSERT_FALSE(z.ok());
  EXPECT_NE(z.status().message().find("stage 0"), std::string::npos) << z.status().to_string();
  auto d = Layout::from_pipelines({{1, {{2, 2, ""}, {2, 1, ""}}}, {1, {{3, 1, ""}}}}, 0);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("pipeline 1 holds 3 layers"), std::string::npos) << d.status().to_string();
  // The Megatron layout is symmetric only: the general form is refused by name.
  auto g = Layout::from_pipelines({{1, {{2, 2, "A"}, {2, 1, "B"}}}}, 0);
  ASSERT_TRUE(g.ok());
  auto mt = megatron_rank_tensors(c, *g, 0, 0);
  ASSERT_FALSE(mt.ok());
  EXPECT_EQ(mt.status().kind(), ErrorKind::kUnsupported) << mt.status().to_string();
  EXPECT_NE(mt.status().message().find("Megatron"), std::string::npos) << mt.status().to_string();
}

}  // namespace hetero_property
}  // namespace ckpt
