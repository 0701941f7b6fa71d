#include "reshard/layout/layout_general.h"

#include <algorithm>
#include <limits>

namespace ckpt {

namespace {

Status bad_general(const std::string& msg) { return Status::Error("BadLayout", msg); }

constexpr int kMaxGeneralParallel = 1 << 20;  // sanity bound on sizes from untrusted JSON

std::string where(int p, int s) { return "pipeline " + std::to_string(p) + " stage " + std::to_string(s); }

// Same tp, ep and etp.
bool same_parallel(const StageSpec& a, const StageSpec& b) {
  return a.tp == b.tp && a.ep == b.ep && a.expert_tp() == b.expert_tp();
}

// What uniform_pipelines compares stage by stage: layers, tp, ep, etp.
bool same_stage_shape(const StageSpec& a, const StageSpec& b) { return a.layers == b.layers && same_parallel(a, b); }

}  // namespace

// ---- accessors (both forms) ----

int Layout::num_pipelines() const { return symmetric() ? dp : static_cast<int>(pipelines.size()); }

int Layout::num_stages(int p) const {
  if (symmetric()) return pp;
  return static_cast<int>(pipelines.at(static_cast<size_t>(p)).stages.size());
}

int Layout::max_stages() const {
  int m = 0;
  for (int p = 0; p < num_pipelines(); ++p) m = std::max(m, num_stages(p));
  return m;
}

int Layout::stage_tp(int p, int s) const {
  if (symmetric()) return tp;
  return pipelines.at(static_cast<size_t>(p)).stages.at(static_cast<size_t>(s)).tp;
}

int Layout::stage_ep(int p, int s) const {
  if (symmetric()) return ep;
  return pipelines.at(static_cast<size_t>(p)).stages.at(static_cast<size_t>(s)).ep;
}

int Layout::stage_expert_tp(int p, int s) const {
  if (symmetric()) return expert_tp();
  return pipelines.at(static_cast<size_t>(p)).stages.at(static_cast<size_t>(s)).expert_tp();
}

bool Layout::expert_parallel() const {
  if (symmetric()) return ep > 1 || expert_tp() != tp;
  for (const PipelineSpec& pl : pipelines)
    for (const StageSpec& st : pl.stages)
      if (st.ep > 1 || st.expert_tp() != st.tp) return true;
  return false;
}

int Layout::stage_layers(int p, int s) const {
  if (symmetric()) return static_cast<int>(std::count(stage_of_layer.begin(), stage_of_layer.end(), s));
  return pipelines.at(static_cast<size_t>(p)).stages.at(static_cast<size_t>(s)).layers;
}

int Layout::stage_first_layer(int p, int s) const {
  if (symmetric()) return first_layer(s);
  int first = 0;
  for (int k = 0; k < s; ++k) first += stage_layers(p, k);
  return first;
}

std::string Layout::stage_device(int p, int s) const {
  if (symmetric()) return "";
  return pipelines.at(static_cast<size_t>(p)).stages.at(static_cast<size_t>(s)).device;
}

int Layout::stage_of(int p, int layer) const {
  if (symmetric()) return layer >= 0 && layer < num_layers() ? stage_of_layer[static_cast<size_t>(layer)] : -1;
  int end = 0;
  for (int s = 0; s < num_stages(p); ++s) {
    end += stage_layers(p, s);
    if (layer < end) return layer >= 0 ? s : -1;
  }
  return -1;
}

int Layout::pipeline_micro_batch(int p) const {
  if (!symmetric()) return pipelines.at(static_cast<size_t>(p)).micro_batch;
  return micro_batch.empty() ? 1 : micro_batch.at(static_cast<size_t>(p));
}

int Layout::num_layers() const {
  if (symmetric()) return static_cast<int>(stage_of_layer.size());
  int n = 0;
  if (!pipelines.empty())
    for (const StageSpec& st : pipelines[0].stages) n += st.layers;
  return n;
}

int Layout::world_size() const {
  if (symmetric()) return tp * pp * dp;
  int64_t n = 0;
  for (const PipelineSpec& pl : pipelines)
    for (const StageSpec& st : pl.stages) n += st.tp;
  return static_cast<int>(std::min<int64_t>(n, std::numeric_limits<int>::max()));
}

int Layout::rank_of(int stage, int pipeline, int tp_rank) const {
  if (symmetric()) return (stage * dp + pipeline) * tp + tp_rank;
  int r = 0;
  for (int s = 0; s < stage; ++s)
    for (int p = 0; p < num_pipelines(); ++p)
      if (s < num_stages(p)) r += stage_tp(p, s);
  for (int p = 0; p < pipeline; ++p)
    if (stage < num_stages(p)) r += stage_tp(p, stage);
  return r + tp_rank;
}

RankPlace Layout::place_of_rank(int rank) const {
  if (symmetric()) return {(rank / tp) % dp, rank / (tp * dp), rank % tp};
  int r = rank;
  for (int s = 0; s < max_stages(); ++s)
    for (int p = 0; p < num_pipelines(); ++p) {
      if (s >= num_stages(p)) continue;
      const int t = stage_tp(p, s);
      if (r < t) return {p, s, r};
      r -= t;
    }
  return {-1, -1, -1};
}

bool Layout::uniform_pipelines() const {
  if (symmetric()) return true;
  for (const PipelineSpec& pl : pipelines) {
    if (pl.stages.size() != pipelines[0].stages.size()) return false;
    for (size_t s = 0; s < pl.stages.size(); ++s)
      if (!same_stage_shape(pl.stages[s], pipelines[0].stages[s])) return false;
  }
  return true;
}

Layout Layout::stage_view(int p, int s) const {
  if (symmetric()) return *this;
  Layout v;
  v.tp = stage_tp(p, s);
  v.ep = stage_ep(p, s);
  v.etp = pipelines.at(static_cast<size_t>(p)).stages.at(static_cast<size_t>(s)).etp;
  v.pp = num_stages(p);
  const bool uniform = uniform_pipelines();
  v.dp = uniform ? num_pipelines() : 1;
  v.zero = zero;
  for (int k = 0; k < v.pp; ++k) v.stage_of_layer.insert(v.stage_of_layer.end(), stage_layers(p, k), k);
  if (uniform)
    for (int q = 0; q < num_pipelines(); ++q) v.micro_batch.push_back(pipeline_micro_batch(q));
  else
    v.micro_batch = {pipeline_micro_batch(p)};
  v.vocab_divisor = vocab_divisor;
  v.profile = profile;
  return v;
}

Result<Layout> Layout::as_symmetric(const std::string& what) const {
  if (symmetric()) return *this;
  bool same_tp = true;
  for (const PipelineSpec& pl : pipelines)
    for (const StageSpec& st : pl.stages) same_tp = same_tp && same_parallel(st, pipelines[0].stages[0]);
  if (!uniform_pipelines() || !same_tp)
    return Status::Unsupported(what + " needs a symmetric layout (one tp, ep and etp for every stage, one stage split "
                                      "for every pipeline), got " + to_string());
  return stage_view(0, 0);
}

void Layout::set_micro_batches(const std::vector<int>& mbs) {
  if (symmetric()) {
    micro_batch = mbs;
    return;
  }
  for (size_t p = 0; p < pipelines.size() && p < mbs.size(); ++p) pipelines[p].micro_batch = mbs[p];
}

Result<Layout> Layout::from_pipelines(std::vector<PipelineSpec> pls, int zero, int64_t vocab_divisor,
                                      const std::string& profile) {
  Layout l;
  l.tp = l.pp = l.dp = 0;
  l.zero = zero;
  l.vocab_divisor = vocab_divisor;
  l.profile = profile;
  l.pipelines = std::move(pls);
  for (PipelineSpec& pl : l.pipelines)
    for (StageSpec& st : pl.stages)
      if (st.etp == st.tp) st.etp = 0;  // one form for "etp = tp"
  CKPT_RETURN_IF_ERROR(validate_general(l));
  bool named = false, same_tp = true;
  for (const PipelineSpec& pl : l.pipelines)
    for (const StageSpec& st : pl.stages) {
      named = named || !st.device.empty();
      same_tp = same_tp && same_parallel(st, l.pipelines[0].stages[0]);
    }
  if (!named && same_tp && l.uniform_pipelines()) {
    Layout sym = l.stage_view(0, 0);
    bool all_one = true;
    for (int m : sym.micro_batch) all_one = all_one && m == 1;
    if (all_one) sym.micro_batch.clear();
    CKPT_RETURN_IF_ERROR(sym.validate());
    return sym;
  }
  return l;
}

// ---- the general form ----

Status validate_general(const Layout& l) {
  if (l.pipelines.empty()) return bad_general("a layout needs at least one pipeline");
  if (l.ep != 1 || l.etp != 0)
    return Status::Error("LayoutUnsupported", "expert parallelism (ep, etp) for a whole layout of pipelines: give ep and etp per "
                                              "stage (docs/MOE.md \"General layouts\")");
  if (l.pipelines.size() > static_cast<size_t>(kMaxGeneralParallel)) return bad_general("too many pipelines");
  if (l.zero != 0 && l.zero != 1) return bad_general("zero must be 0 or 1, got " + std::to_string(l.zero));
  if (l.vocab_divisor < 1) return bad_general("vocab_divisor must be >= 1, got " + std::to_string(l.vocab_divisor));
  int64_t world = 0, layers0 = -1;
  for (size_t p = 0; p < l.pipelines.size(); ++p) {
    const PipelineSpec& pl = l.pipelines[p];
    const int pi = static_cast<int>(p);
    if (pl.micro_batch < 1 || pl.micro_batch > kMaxGeneralParallel)
      return bad_general("pipeline " + std::to_string(p) + " has micro_batch " + std::to_string(pl.micro_batch) +
                 ", expected 1.." + std::to_string(kMaxGeneralParallel));
    if (pl.stages.empty()) return bad_general("pipeline " + std::to_string(p) + " has no stage");
    if (pl.stages.size() > static_cast<size_t>(kMaxGeneralParallel)) return bad_general("pipeline " + std::to_string(p) + " has too many stages");
    int64_t layers = 0;
    for (size_t s = 0; s < pl.stages.size(); ++s) {
      const StageSpec& st = pl.stages[s];
      const int si = static_cast<int>(s);
      if (st.layers < 1 || st.layers > kMaxGeneralParallel)
        return bad_general(where(pi, si) + " holds " + std::to_string(st.layers) + " layers; every stage needs at least one");
      if (st.tp < 1 || st.tp > kMaxGeneralParallel)
        return bad_general(where(pi, si) + " has tp " + std::to_string(st.tp) + ", expected 1.." + std::to_string(kMaxGeneralParallel));
      if (st.ep < 1 || st.etp < 0 || st.ep > kMaxGeneralParallel || st.etp > kMaxGeneralParallel)
        return bad_general(where(pi, si) + " has ep " + std::to_string(st.ep) + " and etp " + std::to_string(st.etp) +
                           ", expected ep >= 1 and etp >= 0 (0: = tp)");
      layers += st.layers;
      world += st.tp;
    }
    if (layers0 < 0) layers0 = layers;
    if (layers != layers0)
      return bad_general("pipeline " + std::to_string(p) + " holds " + std::to_string(layers) + " layers, pipeline 0 holds " +
                 std::to_string(layers0) + " (every pipeline holds every layer once)");
    if (layers0 > kMaxGeneralParallel) return bad_general("too many layers");
  }
  if (world > std::numeric_limits<int>::max()) return bad_general("world size (the sum of every stage's tp) overflows");
  if (l.zero == 1 && !l.uniform_pipelines()) {
    for (size_t p = 1; p < l.pipelines.size(); ++p) {
      const auto& a = l.pipelines[0].stages;
      const auto& b = l.pipelines[p].stages;
      for (size_t s = 0; s < std::max(a.size(), b.size()); ++s) {
        auto desc = [&](const std::vector<StageSpec>& v) {
          if (s >= v.size()) return std::string("nothing");
          const StageSpec& st = v[s];
          const bool experts = st.ep > 1 || st.expert_tp() != st.tp;
          return std::to_string(st.layers) + " layers at tp " + std::to_string(st.tp) +
                 (experts ? " ep " + std::to_string(st.ep) + " etp " + std::to_string(st.expert_tp()) : "");
        };
        if (s >= a.size() || s >= b.size() || !same_stage_shape(a[s], b[s]))
          return bad_general("zero=1 needs every pipeline to hold the same layers at the same tp, ep and etp on each stage "
                     "(ZeRO-1 shards the optimizer state over data-parallel peers holding the same parameters): stage " +
                     std::to_string(s) + " of pipeline 0 holds " + desc(a) + ", of pipeline " + std::to_string(p) +
                     " " + desc(b));
      }
    }
  }
  // Each stage's experts spread over the ranks of its view: tp x pipelines when uniform, else tp.
  const int64_t view_dp = l.uniform_pipelines() ? static_cast<int64_t>(l.pipelines.size()) : 1;
  for (size_t p = 0; p < l.pipelines.size(); ++p)
    for (size_t s = 0; s < l.pipelines[p].stages.size(); ++s) {
      const StageSpec& st = l.pipelines[p].stages[s];
      CKPT_RETURN_IF_ERROR(check_expert_group(st.tp, view_dp, st.ep, st.expert_tp(),
                                              where(static_cast<int>(p), static_cast<int>(s)) + ": "));
    }
  return Status::Ok();
}

Status check_expert_group(int64_t tp, int64_t dp, int64_t ep, int64_t etp, const std::string& ctx) {
  if ((tp * dp) % (ep * etp) == 0) return Status::Ok();
  return bad_general(ctx + "ep=" + std::to_string(ep) + " x etp=" + std::to_string(etp) + " does not divide the " +
                     std::to_string(tp * dp) + " ranks " + (ctx.empty() ? "of a stage" : "holding its experts") + " (tp=" +
                     std::to_string(tp) + " x dp=" + std::to_string(dp) + ")");
}

nlohmann::json general_to_json(const Layout& l) {
  nlohmann::json pls = nlohmann::json::array();
  for (const PipelineSpec& pl : l.pipelines) {
    nlohmann::json stages = nlohmann::json::array();
    for (const StageSpec& st : pl.stages) {
      nlohmann::json sj = {{"layers", st.layers}, {"tp", st.tp}};
      if (st.ep > 1 || st.expert_tp() != st.tp) {
        sj["ep"] = st.ep;
        sj["etp"] = st.expert_tp();
      }
      if (!st.device.empty()) sj["device"] = st.device;
      stages.push_back(sj);
    }
    pls.push_back({{"micro_batch", pl.micro_batch}, {"stages", stages}});
  }
  return {{"pipelines", pls},        {"zero", l.zero},       {"num_layers", l.num_layers()},
          {"vocab_divisor", l.vocab_divisor}, {"profile", l.profile}, {"rank_order", "tp-dp-pp"}};
}

namespace {

Status int_field(const nlohmann::json& j, const char* key, const std::string& ctx, int64_t def, bool required,
                 int64_t lo, int64_t hi, int64_t& out) {
  auto it = j.find(key);
  if (it == j.end()) {
    if (required) return bad_general(ctx + " is missing key '" + key + "'");
    out = def;
    return Status::Ok();
  }
  if (!it->is_number_integer()) return bad_general(ctx + " key '" + key + "' must be an integer, got " + it->dump());
  out = it->get<int64_t>();
  if (out < lo || out > hi)
    return bad_general(ctx + " key '" + key + "' is " + std::to_string(out) + ", expected " + std::to_string(lo) + ".." +
               std::to_string(hi));
  return Status::Ok();
}

Status known_keys(const nlohmann::json& j, std::initializer_list<const char*> keys, const std::string& ctx) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool ok = false;
    for (const char* k : keys) ok = ok || it.key() == k;
    if (!ok && (it.key() == "ep" || it.key() == "etp"))  // expert parallelism is per stage: docs/MOE.md "General layouts"
      return Status::Error("LayoutUnsupported", ctx + " gives '" + it.key() + "': expert parallelism for a whole " + ctx.substr(0, ctx.find(' ')) +
                                                    " is not supported; give ep and etp per stage (docs/MOE.md \"General layouts\")");
    if (!ok) return bad_general(ctx + " has an unknown key '" + it.key() + "'");
  }
  return Status::Ok();
}

}  // namespace

Result<Layout> general_from_json(const nlohmann::json& j) {
  CKPT_RETURN_IF_ERROR(
      known_keys(j, {"pipelines", "zero", "num_layers", "vocab_divisor", "profile", "rank_order", "zero_shard"}, "layout"));
  const nlohmann::json& pj = j.at("pipelines");
  if (!pj.is_array() || pj.empty()) return bad_general("layout key 'pipelines' must be a non-empty array");
  if (pj.size() > static_cast<size_t>(kMaxGeneralParallel)) return bad_general("layout key 'pipelines' is too long");
  std::vector<PipelineSpec> pls;
  for (size_t p = 0; p < pj.size(); ++p) {
    const std::string ctx = "pipeline " + std::to_string(p);
    const nlohmann::json& e = pj[p];
    if (!e.is_object()) return bad_general(ctx + " must be an object {\"micro_batch\": m, \"stages\": [...]}");
    CKPT_RETURN_IF_ERROR(known_keys(e, {"micro_batch", "stages"}, ctx));
    PipelineSpec pl;
    int64_t mb;
    CKPT_RETURN_IF_ERROR(int_field(e, "micro_batch", ctx, 1, false, 1, kMaxGeneralParallel, mb));
    pl.micro_batch = static_cast<int>(mb);
    auto sit = e.find("stages");
    if (sit == e.end() || !sit->is_array() || sit->empty()) return bad_general(ctx + " needs a non-empty array 'stages'");
    if (sit->size() > static_cast<size_t>(kMaxGeneralParallel)) return bad_general(ctx + " has too many stages");
    for (size_t s = 0; s < sit->size(); ++s) {
      const std::string sctx = where(static_cast<int>(p), static_cast<int>(s));
      const nlohmann::json& sj = (*sit)[s];
      if (!sj.is_object()) return bad_general(sctx + " must be an object {\"layers\": n, \"tp\": t, \"device\": \"X\"}");
      CKPT_RETURN_IF_ERROR(known_keys(sj, {"layers", "tp", "ep", "etp", "device"}, sctx));
      StageSpec st;
      int64_t v;
      CKPT_RETURN_IF_ERROR(int_field(sj, "layers", sctx, 1, true, 1, kMaxGeneralParallel, v));
      st.layers = static_cast<int>(v);
      CKPT_RETURN_IF_ERROR(int_field(sj, "tp", sctx, 1, false, 1, kMaxGeneralParallel, v));
      st.tp = static_cast<int>(v);
      CKPT_RETURN_IF_ERROR(int_field(sj, "ep", sctx, 1, false, 1, kMaxGeneralParallel, v));
      st.ep = static_cast<int>(v);
      CKPT_RETURN_IF_ERROR(int_field(sj, "etp", sctx, 0, false, 1, kMaxGeneralParallel, v));
      st.etp = static_cast<int>(v);
      if (auto d = sj.find("device"); d != sj.end()) {
        if (!d->is_string() || d->get<std::string>().size() > 256)
          return bad_general(sctx + " key 'device' must be a string (at most 256 bytes)");
        st.device = d->get<std::string>();
      }
      pl.stages.push_back(std::move(st));
    }
    pls.push_back(std::move(pl));
  }
  int64_t zero, vd;
  CKPT_RETURN_IF_ERROR(int_field(j, "zero", "layout", 0, false, 0, 1, zero));
  CKPT_RETURN_IF_ERROR(int_field(j, "vocab_divisor", "layout", 128, false, 1, std::numeric_limits<int>::max(), vd));
  std::string profile = "reference";
  if (auto it = j.find("profile"); it != j.end()) {
    if (!it->is_string()) return bad_general("layout key 'profile' must be a string");
    profile = it->get<std::string>();
  }
  if (auto it = j.find("rank_order"); it != j.end() && *it != "tp-dp-pp")
    return Status::Unsupported("layout rank_order " + it->dump() + " (only \"tp-dp-pp\")");
  CKPT_ASSIGN_OR_RETURN(Layout l, Layout::from_pipelines(std::move(pls), static_cast<int>(zero), vd, profile));
  if (auto it = j.find("num_layers"); it != j.end() && (!it->is_number_integer() || it->get<int64_t>() != l.num_layers()))
    return bad_general("layout says num_layers=" + it->dump() + " but its pipelines hold " + std::to_string(l.num_layers()) +
               " layers");
  return l;
}

std::string general_to_string(const Layout& l) {
  std::string s = std::to_string(l.pipelines.size()) + " pipeline" + (l.pipelines.size() == 1 ? "" : "s") + ": ";
  for (size_t p = 0; p < l.pipelines.size(); ++p) {
    const PipelineSpec& pl = l.pipelines[p];
    s += (p ? ", " : "") + std::string("mb=") + std::to_string(pl.micro_batch) + " [";
    for (size_t k = 0; k < pl.stages.size(); ++k) {
      const StageSpec& st = pl.stages[k];
      s += (k ? " | " : "") + std::to_string(st.layers) + " tp" + std::to_string(st.tp);
      if (st.ep > 1) s += " ep" + std::to_string(st.ep);
      if (st.expert_tp() != st.tp) s += " etp" + std::to_string(st.expert_tp());
      if (!st.device.empty()) s += " " + st.device;
    }
    s += "]";
  }
  return s + " zero=" + std::to_string(l.zero);
}

}  // namespace ckpt
