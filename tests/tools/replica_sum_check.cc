// replica_sum_check: trainer/optim/replica_sum.h under mpirun against a naive reference.
// Every rank fills each box it holds (place_in_layout) with a deterministic function of (rank,
// tensor, global element index) (--fill stage: of (pipeline, stage) instead of rank, so that TP
// replicas agree as real gradients do), runs ReplicaSum::sum in double and in float, and sends its
// values and its counted() boxes to rank 0, which checks them element by element against the
// naive reference: an element held by two or more (pipeline, stage) of the scope (the world, or
// the rank's own pipeline) becomes the sum over those (pipeline, stage) of the value of their
// lowest TP rank holding it (an expert tensor of an expert-parallel layout: of every rank holding
// it); any other element keeps its own value. Values are multiples of 1/8
// below 128 in magnitude, so every sum is exact in float and double: the error must be 0.
// counted(): every element of every tensor is counted by exactly one rank, the lowest holding it.
// Negative controls (in the same run; they must find mismatches where the layout makes them
// differ): the reference that also sums TP replicas ("tp_replicas"), the one that ignores the
// pipeline scope ("ignore_scope"), and the gathered values with one element changed ("perturbed").
// sum() must refuse box lists that differ from the plan ("validation").
// Symmetric layouts with --fill stage are also compared with the trainer's old path (tied
// embedding all-reduce over LayoutGroups::embedding, then the DP all-reduce for scope world).
// Prints on rank 0 one JSON line {"ok", "ranks", "checks": [{"scope", "dtype", "max_err",
// "mismatches", "elements", "summed", "tp_replicas", "ignore_scope", "perturbed", "legacy_max_err",
// "elements_per_sum"}], "counted": {"elements", "bad", "first"}}; exit 1 on any mismatch, 3 on an
// error ({"ok": false, "code", "message"}).
//   mpirun -np N replica_sum_check CONFIG LAYOUT [--scopes world,pipeline] [--fill rank|stage]
//                                  [--corrupt R]   (rank R changes one summed value: must fail)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <type_traits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "converters/model/llama_config.h"
#include "converters/model/llama_sharding.h"
#include "reshard/dist/comm.h"
#include "reshard/layout/tensor_placement.h"
#include "trainer/model/init.h"
#include "trainer/optim/replica_sum.h"

using namespace ckpt;
using namespace ckpt::trainer;
using json = nlohmann::json;
using Scope = ReplicaSum::Scope;

namespace {

struct Options {
  std::string config, layout;
  std::vector<std::string> scopes{"world"};
  bool by_stage = false;
  int corrupt = -1;
};

// What every rank knows: the layout and every rank's box of every tensor.
struct Setup {
  Options o;
  Layout layout;
  std::vector<TensorMeta> tensors;
  std::vector<std::vector<std::optional<Box>>> box;  // [tensor][rank] (nullopt: not held)
  std::vector<RankPlace> place;                      // [rank]
  std::vector<char> expert;                          // [tensor]: an expert tensor of an expert-parallel layout
  int rank = 0;
};

enum class Ref { kRight, kTpReplicas, kIgnoreScope };

double value(const Setup& s, int rank, size_t ti, int64_t g) {
  const RankPlace& p = s.place[static_cast<size_t>(rank)];
  const uint64_t who = s.o.by_stage ? static_cast<uint64_t>(p.pipeline * 1000 + p.stage + 7)
                                    : static_cast<uint64_t>(rank + 1) << 20;
  const uint64_t x = splitmix64(fnv1a64(s.tensors[ti].name) ^ (who * 0x9E3779B97F4A7C15ULL) ^ static_cast<uint64_t>(g));
  return static_cast<double>(static_cast<int64_t>(x % 2047) - 1023) / 8.0;
}

// Calls f(global multi-index, global flat index) for every element of `b` in row-major order.
template <class F>
void for_each_element(const Box& b, const Shape& shape, F f) {
  if (b.empty()) return;
  Shape idx = b.offset;
  for (int64_t n = 0; n < b.numel(); ++n) {
    int64_t g = 0;
    for (size_t d = 0; d < shape.size(); ++d) g = g * shape[d] + idx[d];
    f(idx, g);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < b.offset[d] + b.extent[d]) break;
      idx[d] = b.offset[d];
    }
  }
}

bool holds(const std::optional<Box>& b, const Shape& idx) {
  if (!b) return false;
  for (size_t d = 0; d < idx.size(); ++d)
    if (idx[d] < b->offset[d] || idx[d] >= b->offset[d] + b->extent[d]) return false;
  return true;
}

// The naive reference for rank r's element idx (flat g) of tensor ti. *summed: a sum was due.
// An expert tensor (expert parallelism): every holder is its own contributor (each computed
// other routed rows), so the sum runs over every rank holding the element.
double expected(const Setup& s, Scope scope, Ref ref, int r, size_t ti, const Shape& idx, int64_t g, bool* summed) {
  struct Stage { int p, st, tp, rank; };
  std::vector<Stage> lowest;  // per (pipeline, stage) holding the element: its lowest TP rank
  double all = 0;
  const int mine = s.place[static_cast<size_t>(r)].pipeline;
  for (int q = 0; q < static_cast<int>(s.place.size()); ++q) {
    const RankPlace& pq = s.place[static_cast<size_t>(q)];
    if (!holds(s.box[ti][static_cast<size_t>(q)], idx)) continue;
    if (scope == Scope::kPipeline && ref != Ref::kIgnoreScope && pq.pipeline != mine) continue;
    all += value(s, q, ti, g);
    bool found = false;
    for (Stage& x : lowest)
      if (x.p == pq.pipeline && x.st == pq.stage && !s.expert[ti]) {
        found = true;
        if (pq.tp_rank < x.tp) x = {pq.pipeline, pq.stage, pq.tp_rank, q};
      }
    if (!found) lowest.push_back({pq.pipeline, pq.stage, pq.tp_rank, q});
  }
  *summed = lowest.size() >= 2;
  if (!*summed) return value(s, r, ti, g);
  if (ref == Ref::kTpReplicas) return all;
  double sum = 0;
  for (const Stage& x : lowest) sum += value(s, x.rank, ti, g);
  return sum;
}

struct Tally {
  double max_err = 0;
  int64_t mismatches = 0, elements = 0, summed = 0;
  std::string first;
};

// Rank 0: every rank's values (`got[r]`: its non-empty boxes in tensor order) against the reference.
Tally compare(const Setup& s, Scope scope, Ref ref, const std::vector<std::vector<double>>& got) {
  Tally t;
  for (int r = 0; r < static_cast<int>(got.size()); ++r) {
    size_t k = 0;
    for (size_t ti = 0; ti < s.tensors.size(); ++ti) {
      const std::optional<Box>& b = s.box[ti][static_cast<size_t>(r)];
      if (!b) continue;
      for_each_element(*b, s.tensors[ti].shape, [&](const Shape& idx, int64_t g) {
        bool summed = false;
        const double want = expected(s, scope, ref, r, ti, idx, g, &summed);
        const double have = k < got[static_cast<size_t>(r)].size() ? got[static_cast<size_t>(r)][k] : NAN;
        ++k;
        ++t.elements;
        t.summed += summed;
        const double err = std::abs(have - want);
        if (!(err == 0)) {
          if (t.mismatches++ == 0)
            t.first = "rank " + std::to_string(r) + " " + s.tensors[ti].name + " element " + std::to_string(g) +
                      ": got " + std::to_string(have) + ", expected " + std::to_string(want);
          t.max_err = std::max(t.max_err, std::isnan(err) ? INFINITY : err);
        }
      });
    }
    if (k != got[static_cast<size_t>(r)].size() && t.mismatches++ == 0)
      t.first = "rank " + std::to_string(r) + " sent " + std::to_string(got[static_cast<size_t>(r)].size()) +
                " values, it holds " + std::to_string(k);
  }
  return t;
}

// Rank 0: the counted() boxes of every rank (json [tensor] -> [[offset, extent], ..]) tile every
// tensor once, each element by the lowest rank holding it, inside the rank's box.
json check_counted(const Setup& s, const std::vector<json>& counted) {
  int64_t elements = 0, bad = 0;
  std::string first;
  auto fail = [&](const std::string& m) {
    if (bad++ == 0) first = m;
  };
  for (size_t ti = 0; ti < s.tensors.size(); ++ti) {
    const TensorMeta& t = s.tensors[ti];
    std::vector<int> by(static_cast<size_t>(*shape_numel(t.shape)), -1);
    for (int r = 0; r < static_cast<int>(counted.size()); ++r)
      for (const json& jb : counted[static_cast<size_t>(r)].at(ti)) {
        const Box b{jb.at(0).get<Shape>(), jb.at(1).get<Shape>()};
        const std::optional<Box>& mine = s.box[ti][static_cast<size_t>(r)];
        if (!mine || !mine->contains(b)) fail(t.name + ": rank " + std::to_string(r) + " counts " + b.to_string() + " outside its box");
        for_each_element(b, t.shape, [&](const Shape& idx, int64_t g) {
          int lowest = -1;
          for (int q = 0; q < static_cast<int>(s.place.size()) && lowest < 0; ++q)
            if (holds(s.box[ti][static_cast<size_t>(q)], idx)) lowest = q;
          if (by[static_cast<size_t>(g)] >= 0 || lowest != r)
            fail(t.name + " element " + std::to_string(g) + " counted by rank " + std::to_string(r) + " (again: " +
                 std::to_string(by[static_cast<size_t>(g)] >= 0) + ", lowest holder " + std::to_string(lowest) + ")");
          by[static_cast<size_t>(g)] = r;
        });
      }
    for (size_t g = 0; g < by.size(); ++g) {
      elements += by[g] >= 0;
      if (by[g] < 0) fail(t.name + " element " + std::to_string(g) + " counted by no rank");
    }
  }
  return {{"elements", elements}, {"bad", bad}, {"first", first}};
}

// This rank's buffers of one dtype: a box per held tensor, filled with value().
template <class T>
struct Buffers {
  std::vector<std::vector<T>> data;  // [tensor]
  std::vector<HeldBox<T>> held;

  explicit Buffers(const Setup& s) : data(s.tensors.size()) {
    for (size_t ti = 0; ti < s.tensors.size(); ++ti) {
      const std::optional<Box>& b = s.box[ti][static_cast<size_t>(s.rank)];
      if (!b) continue;
      auto& d = data[ti];
      for_each_element(*b, s.tensors[ti].shape, [&](const Shape&, int64_t g) {
        d.push_back(static_cast<T>(value(s, s.rank, ti, g)));
      });
      held.push_back({s.tensors[ti].name, *b, d.empty() ? nullptr : d.data()});
    }
  }
  std::string bytes() const {
    std::string out;
    for (const auto& d : data)
      for (T v : d) {
        const double x = static_cast<double>(v);
        out.append(reinterpret_cast<const char*>(&x), sizeof x);
      }
    return out;
  }
};

// The trainer's old path for symmetric layouts: tied embedding over the embedding group, then
// (scope world) every tensor over the DP group. Returns the largest |old - new| over the world.
Result<double> legacy_error(Comm& world, const Setup& s, Scope scope, const Buffers<double>& summed) {
  CKPT_ASSIGN_OR_RETURN(LayoutGroups g, LayoutGroups::make(world, s.layout));
  Buffers<double> old(s);
  const bool tied_group = s.layout.pp > 1;
  for (size_t ti = 0; ti < s.tensors.size(); ++ti) {
    auto& d = old.data[ti];
    if (!s.box[ti][static_cast<size_t>(s.rank)]) continue;
    const int64_t n = static_cast<int64_t>(d.size());
    if (tied_group && s.tensors[ti].name == "model.embed_tokens.weight" && n > 0)
      CKPT_RETURN_IF_ERROR(g.embedding.all_reduce_sum(d.data(), n));
    if (scope == Scope::kWorld && n > 0) CKPT_RETURN_IF_ERROR(g.dp.all_reduce_sum(d.data(), n));
  }
  double err = 0;
  for (size_t ti = 0; ti < s.tensors.size(); ++ti)
    for (size_t k = 0; k < old.data[ti].size(); ++k) err = std::max(err, std::abs(old.data[ti][k] - summed.data[ti][k]));
  CKPT_RETURN_IF_ERROR(world.all_reduce_max(&err, 1));
  return err;
}

// sum() refuses lists that differ from the plan before any communication: a changed box, a
// missing one, one given twice, an unknown tensor. Returns "" or what went wrong, and in *example
// the message about the changed box.
std::string check_validation(const Setup& s, ReplicaSum& rs, std::string* example) {
  Buffers<double> b(s);
  size_t k = 0;
  while (k < b.held.size() && b.held[k].box.empty()) ++k;
  if (k == b.held.size()) return "";
  const HeldBox<double> first = b.held[k];
  std::string out;
  auto expect = [&](const char* what, std::vector<HeldBox<double>> list, const std::string& name) {
    Status st = rs.sum(list);
    if (st.ok() || st.code() != "ReplicaSumMismatch" || st.message().find("'" + name + "'") == std::string::npos)
      out += std::string(what) + ": " + (st.ok() ? "accepted" : st.to_string()) + "; ";
    return st.message();
  };
  std::vector<HeldBox<double>> l = b.held;
  l[k].box.extent[0] -= 1;
  *example = expect("changed box", l, first.tensor);
  l = b.held;
  l.erase(l.begin() + static_cast<std::ptrdiff_t>(k));
  expect("missing box", l, first.tensor);
  l = b.held;
  l.push_back(first);
  expect("box twice", l, first.tensor);
  l = b.held;
  l.push_back({"no.such.tensor", first.box, first.data});
  expect("unknown tensor", l, "no.such.tensor");
  return out;
}

std::vector<double> doubles(const std::string& bytes) {
  std::vector<double> v(bytes.size() / sizeof(double));
  if (!v.empty()) std::memcpy(v.data(), bytes.data(), v.size() * sizeof(double));
  return v;
}

// One scope and dtype: sum, gather to rank 0, compare. Returns rank 0's report (null elsewhere).
template <class T>
Result<json> check_one(Comm& world, const Setup& s, ReplicaSum& rs, Scope scope, bool corrupt) {
  Buffers<T> b(s);
  CKPT_RETURN_IF_ERROR(rs.sum(b.held));
  if (corrupt) {
    for (auto& d : b.data)
      if (!d.empty()) {
        d[0] += static_cast<T>(0.5);
        break;
      }
  }
  double legacy = -1;
  if constexpr (std::is_same_v<T, double>) {
    if (s.layout.symmetric() && s.o.by_stage) {
      CKPT_ASSIGN_OR_RETURN(legacy, legacy_error(world, s, scope, b));
    }
  }
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> all, world.gather(b.bytes()));
  std::vector<int64_t> eps(static_cast<size_t>(world.size()));
  eps[static_cast<size_t>(world.rank())] = rs.elements_per_sum();
  CKPT_RETURN_IF_ERROR(world.all_reduce_sum(eps.data(), static_cast<int64_t>(eps.size())));
  if (world.rank() != 0) return json();
  std::vector<std::vector<double>> got;
  for (const std::string& a : all) got.push_back(doubles(a));
  const Tally t = compare(s, scope, Ref::kRight, got);
  const Tally tp = compare(s, scope, Ref::kTpReplicas, got);
  const Tally is = compare(s, scope, Ref::kIgnoreScope, got);
  for (auto& v : got)
    if (!v.empty()) {
      v.back() += 1.0;
      break;
    }
  const Tally pert = compare(s, scope, Ref::kRight, got);
  return json{{"scope", scope == Scope::kWorld ? "world" : "pipeline"}, {"dtype", sizeof(T) == 8 ? "f64" : "f32"},
              {"max_err", t.max_err}, {"mismatches", t.mismatches}, {"first", t.first},
              {"elements", t.elements}, {"summed", t.summed}, {"tp_replicas", tp.mismatches},
              {"ignore_scope", is.mismatches}, {"perturbed", pert.mismatches},
              {"legacy_max_err", legacy < 0 ? json() : json(legacy)}, {"elements_per_sum", eps}};
}

Result<json> run(Comm& world, const Options& o) {
  Setup s;
  s.o = o;
  s.rank = world.rank();
  CKPT_ASSIGN_OR_RETURN(LlamaConfig cfg, LlamaConfig::from_file(o.config));
  CKPT_ASSIGN_OR_RETURN(s.layout, Layout::from_file(o.layout));
  LlamaShardingRules rules(cfg);
  s.tensors = llama_model_tensors(cfg, DType::kF32);
  for (int r = 0; r < s.layout.world_size(); ++r) s.place.push_back(s.layout.place_of_rank(r));
  for (const TensorMeta& t : s.tensors) {
    CKPT_ASSIGN_OR_RETURN(std::vector<StagePlacement> pl, place_in_layout(t, s.layout, rules));
    s.box.emplace_back(s.place.size());
    s.expert.push_back(std::any_of(pl.begin(), pl.end(), [](const StagePlacement& sp) { return sp.expert; }) ? 1 : 0);
    for (const StagePlacement& sp : pl)
      for (int k = 0; k < static_cast<int>(sp.tp_boxes.size()); ++k)
        s.box.back()[static_cast<size_t>(s.layout.rank_of(sp.stage, sp.pipeline, k))] = sp.tp_boxes[static_cast<size_t>(k)];
  }
  json out{{"ok", true}, {"ranks", world.size()}, {"layout", s.layout.to_string()}, {"checks", json::array()}};
  for (size_t i = 0; i < o.scopes.size(); ++i) {
    const Scope scope = o.scopes[i] == "pipeline" ? Scope::kPipeline : Scope::kWorld;
    CKPT_ASSIGN_OR_RETURN(ReplicaSum rs, ReplicaSum::make(world, s.layout, rules, s.tensors, scope));
    CKPT_ASSIGN_OR_RETURN(json d, check_one<double>(world, s, rs, scope, i == 0 && o.corrupt == world.rank()));
    CKPT_ASSIGN_OR_RETURN(json f, check_one<float>(world, s, rs, scope, false));
    out["checks"].push_back(d);
    out["checks"].push_back(f);
    if (i > 0) continue;
    json mine = json::array();  // counted() of every tensor's box of this rank
    for (size_t ti = 0; ti < s.tensors.size(); ++ti) {
      mine.push_back(json::array());
      const std::optional<Box>& b = s.box[ti][static_cast<size_t>(s.rank)];
      if (b)
        for (const Box& c : rs.counted(s.tensors[ti].name, *b)) mine.back().push_back(json{c.offset, c.extent});
    }
    std::string example;
    const std::string bad = check_validation(s, rs, &example);
    CKPT_ASSIGN_OR_RETURN(std::vector<std::string> all, world.gather(json{mine, bad}.dump()));
    std::vector<json> counted;
    json bads = json::array();
    for (const std::string& a : all) {
      counted.push_back(json::parse(a).at(0));
      if (!json::parse(a).at(1).get<std::string>().empty()) bads.push_back(json::parse(a).at(1));
    }
    if (world.rank() == 0) {
      out["counted"] = check_counted(s, counted);
      out["validation"] = {{"bad", bads}, {"example", example}};
    }
  }
  return out;
}

Result<Options> parse(int argc, char** argv) {
  Options o;
  std::vector<std::string> pos;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.starts_with("--") && i + 1 >= argc) return Status::InvalidArgument(a + " needs a value");
    if (a == "--scopes") {
      o.scopes.clear();
      for (std::string rest = argv[++i]; !rest.empty();) {
        const size_t c = rest.find(',');
        o.scopes.push_back(rest.substr(0, c));
        rest = c == std::string::npos ? "" : rest.substr(c + 1);
        if (o.scopes.back() != "world" && o.scopes.back() != "pipeline")
          return Status::InvalidArgument("--scopes: world or pipeline, got '" + o.scopes.back() + "'");
      }
    } else if (a == "--fill") {
      const std::string f = argv[++i];
      if (f != "rank" && f != "stage") return Status::InvalidArgument("--fill: rank or stage, got '" + f + "'");
      o.by_stage = f == "stage";
    } else if (a == "--corrupt") {
      o.corrupt = std::stoi(argv[++i]);
    } else if (a.starts_with("--")) {
      return Status::InvalidArgument("unknown option " + a);
    } else {
      pos.push_back(a);
    }
  }
  if (pos.size() != 2) return Status::InvalidArgument("usage: replica_sum_check CONFIG LAYOUT [options]");
  o.config = pos[0];
  o.layout = pos[1];
  return o;
}

bool all_ok(const json& out) {
  for (const json& c : out["checks"])
    if (c["mismatches"].get<int64_t>() != 0 || (!c["legacy_max_err"].is_null() && c["legacy_max_err"].get<double>() != 0))
      return false;
  return out["counted"]["bad"].get<int64_t>() == 0 && out["validation"]["bad"].empty();
}

}  // namespace

int main(int argc, char** argv) {
  auto opts = parse(argc, argv);
  if (!opts.ok()) {
    std::fprintf(stderr, "replica_sum_check: %s\n", opts.status().to_string().c_str());
    return 2;
  }
  Comm& world = Comm::world();
  auto r = run(world, *opts);
  if (!r.ok()) {
    if (world.rank() == 0)
      std::printf("%s\n", json{{"ok", false}, {"code", r.status().code()}, {"message", r.status().message()}}.dump().c_str());
    Comm::abandon(r.status());
    return 3;
  }
  if (world.rank() != 0) return 0;
  const bool ok = all_ok(*r);
  (*r)["ok"] = ok;
  std::printf("%s\n", r->dump().c_str());
  return ok ? 0 : 1;
}
