#include "reshard/layout/layout.h"

#include <algorithm>
#include <limits>

#include "formats/base/json_read.h"
#include "reshard/layout/layout_flagscale.h"
#include "reshard/layout/layout_general.h"

namespace ckpt {

namespace {
Status bad(const std::string& msg) { return Status::Error("BadLayout", msg); }

constexpr int kMaxParallel = 1 << 20;  // sanity bound on tp/pp/dp from untrusted JSON
}  // namespace

int Layout::first_layer(int stage) const {
  if (!symmetric()) return pipelines.empty() ? 0 : stage_first_layer(0, stage);
  for (int i = 0; i < num_layers(); ++i)
    if (stage_of_layer[i] == stage) return i;
  return num_layers();
}

int Layout::layers_in_stage(int stage) const {
  if (!symmetric()) return stage_layers(0, stage);
  return static_cast<int>(std::count(stage_of_layer.begin(), stage_of_layer.end(), stage));
}

int64_t Layout::padded_vocab(int64_t vocab_size) const {
  const int64_t m = std::max<int64_t>(1, vocab_divisor) * std::max(1, tp);
  if (vocab_size <= 0) return 0;
  return (vocab_size + m - 1) / m * m;
}

Result<Layout> Layout::make(int tp, int pp, int dp, int zero, int num_layers, const std::vector<int>& layers_per_stage) {
  Layout l;
  l.tp = tp;
  l.pp = pp;
  l.dp = dp;
  l.zero = zero;
  if (pp < 1) return bad("pp must be >= 1, got " + std::to_string(pp));
  if (num_layers < 0) return bad("num_layers must be >= 0, got " + std::to_string(num_layers));
  if (!layers_per_stage.empty()) {
    if (static_cast<int>(layers_per_stage.size()) != pp)
      return bad("--pp-layers gives " + std::to_string(layers_per_stage.size()) + " stages, pp is " + std::to_string(pp));
    int64_t sum = 0;
    for (int s = 0; s < pp; ++s) {
      if (layers_per_stage[s] < 1)
        return bad("pipeline stage " + std::to_string(s) + " gets " + std::to_string(layers_per_stage[s]) +
                   " layers; every stage needs at least one");
      sum += layers_per_stage[s];
    }
    if (sum != num_layers)
      return bad("--pp-layers sums to " + std::to_string(sum) + " layers, the model has " + std::to_string(num_layers));
    for (int s = 0; s < pp; ++s) l.stage_of_layer.insert(l.stage_of_layer.end(), layers_per_stage[s], s);
  } else {
    if (pp > num_layers)
      return bad("pp=" + std::to_string(pp) + " pipeline stages for only " + std::to_string(num_layers) +
                 " layers (every stage needs at least one layer)");
    const int base = num_layers / pp, extra = num_layers % pp;
    for (int s = 0; s < pp; ++s) l.stage_of_layer.insert(l.stage_of_layer.end(), base + (s < extra ? 1 : 0), s);
  }
  CKPT_RETURN_IF_ERROR(l.validate());
  return l;
}

Status Layout::validate() const {
  if (!symmetric()) return validate_general(*this);
  if (tp < 1 || pp < 1 || dp < 1 || tp > kMaxParallel || pp > kMaxParallel || dp > kMaxParallel)
    return bad("tp, pp and dp must be in 1.." + std::to_string(kMaxParallel) + ", got tp=" + std::to_string(tp) +
               " pp=" + std::to_string(pp) + " dp=" + std::to_string(dp));
  if (static_cast<int64_t>(tp) * pp * dp > std::numeric_limits<int>::max())
    return bad("world size tp*pp*dp overflows: tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) +
               " dp=" + std::to_string(dp));
  if (zero != 0 && zero != 1) return bad("zero must be 0 or 1, got " + std::to_string(zero));
  if (ep < 1 || etp < 0 || ep > kMaxParallel || etp > kMaxParallel)
    return bad("ep must be >= 1 and etp >= 0 (0: = tp), got ep=" + std::to_string(ep) + " etp=" + std::to_string(etp));
  CKPT_RETURN_IF_ERROR(check_expert_group(tp, dp, ep, expert_tp(), ""));
  if (num_layers() < pp)
    return bad("pp=" + std::to_string(pp) + " pipeline stages for only " + std::to_string(num_layers()) +
               " layers (every stage needs at least one layer)");
  std::vector<int> count(static_cast<size_t>(pp), 0);
  for (int i = 0; i < num_layers(); ++i) {
    const int s = stage_of_layer[i];
    if (s < 0 || s >= pp)
      return bad("layer " + std::to_string(i) + " is on stage " + std::to_string(s) + ", expected 0.." +
                 std::to_string(pp - 1));
    if (i > 0 && s < stage_of_layer[i - 1])
      return bad("layer " + std::to_string(i) + " is on stage " + std::to_string(s) + " after layer " +
                 std::to_string(i - 1) + " on stage " + std::to_string(stage_of_layer[i - 1]) +
                 " (stages hold contiguous, increasing layer ranges)");
    ++count[s];
  }
  for (int s = 0; s < pp; ++s)
    if (count[s] == 0) return bad("pipeline stage " + std::to_string(s) + " holds no layer");
  if (!micro_batch.empty()) {
    if (static_cast<int>(micro_batch.size()) != dp)
      return bad("micro_batch has " + std::to_string(micro_batch.size()) + " entries, dp is " + std::to_string(dp));
    for (size_t i = 0; i < micro_batch.size(); ++i)
      if (micro_batch[i] < 1)
        return bad("micro_batch of DP rank " + std::to_string(i) + " is " + std::to_string(micro_batch[i]) +
                   ", expected >= 1");
  }
  if (vocab_divisor < 1) return bad("vocab_divisor must be >= 1, got " + std::to_string(vocab_divisor));
  return Status::Ok();
}

nlohmann::json Layout::to_json() const {
  if (!symmetric()) return general_to_json(*this);
  std::vector<int> per_stage(static_cast<size_t>(std::max(pp, 0)), 0);
  for (int s : stage_of_layer)
    if (s >= 0 && s < pp) ++per_stage[s];
  nlohmann::json j = {{"tp", tp},
                      {"pp", pp},
                      {"dp", dp},
                      {"zero", zero},
                      {"layers_per_stage", per_stage},
                      {"num_layers", num_layers()},
                      {"vocab_divisor", vocab_divisor},
                      {"profile", profile},
                      {"rank_order", "tp-dp-pp"}};
  if (!micro_batch.empty()) j["micro_batch"] = micro_batch;
  if (expert_parallel()) {
    j["ep"] = ep;
    j["etp"] = expert_tp();
  }
  return j;
}

Result<Layout> Layout::from_file(const std::string& path) {
  CKPT_ASSIGN_OR_RETURN(nlohmann::json j, read_json_file(path, kLayoutJsonLimits, "layout file"));
  auto r = from_json(j);
  if (!r.ok()) return r.take_status().with_file(path);
  return r;
}

void Layout::keep_source_settings(const nlohmann::json& src) {
  if (!src.is_object()) return;
  auto vd = src.find("vocab_divisor");
  if (vd != src.end() && vd->is_number_integer() && vd->get<int64_t>() >= 1) vocab_divisor = vd->get<int64_t>();
  auto pr = src.find("profile");
  if (pr != src.end() && pr->is_string()) profile = pr->get<std::string>();
}

Result<Layout> Layout::from_json(const nlohmann::json& j) {
  if (!j.is_object()) return bad("layout must be a JSON object, got " + std::string(j.type_name()));
  if (j.contains("pipelines") && (j.contains("ep") || j.contains("etp")))
    return Status::Error("LayoutUnsupported", "expert parallelism (ep, etp) for a whole layout of pipelines: give ep and etp per "
                                              "stage (docs/MOE.md \"General layouts\")");
  if (j.contains("pipelines")) return general_from_json(j);
  if (j.contains("hetero_process_meshes")) return layout_from_flagscale(j);
  auto get_int = [&](const char* key, int64_t def, bool required, int64_t& out) -> Status {
    if (!j.contains(key)) {
      if (required) return bad(std::string("layout is missing key '") + key + "'");
      out = def;
      return Status::Ok();
    }
    const auto& v = j.at(key);
    if (!v.is_number_integer())
      return bad(std::string("layout key '") + key + "' must be an integer, got " + v.dump());
    out = v.get<int64_t>();
    if (out < 0 || out > std::numeric_limits<int>::max())
      return bad(std::string("layout key '") + key + "' out of range: " + std::to_string(out));
    return Status::Ok();
  };
  int64_t tp, pp, dp, zero, vd, ep, etp;
  CKPT_RETURN_IF_ERROR(get_int("tp", 1, true, tp));
  CKPT_RETURN_IF_ERROR(get_int("pp", 1, true, pp));
  CKPT_RETURN_IF_ERROR(get_int("dp", 1, false, dp));
  CKPT_RETURN_IF_ERROR(get_int("zero", 0, false, zero));
  CKPT_RETURN_IF_ERROR(get_int("vocab_divisor", 128, false, vd));
  CKPT_RETURN_IF_ERROR(get_int("ep", 1, false, ep));
  CKPT_RETURN_IF_ERROR(get_int("etp", 0, false, etp));
  Layout l;
  l.ep = static_cast<int>(ep);
  l.etp = static_cast<int>(etp);
  l.tp = static_cast<int>(tp);
  l.pp = static_cast<int>(pp);
  l.dp = static_cast<int>(dp);
  l.zero = static_cast<int>(zero);
  l.vocab_divisor = vd;
  auto int_list = [&](const char* key, std::vector<int>& out) -> Status {
    const auto& v = j.at(key);
    if (!v.is_array()) return bad(std::string("layout key '") + key + "' must be an array of integers");
    if (v.size() > static_cast<size_t>(kMaxParallel)) return bad(std::string("layout key '") + key + "' is too long");
    for (const auto& e : v) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() > kMaxParallel)
        return bad(std::string("layout key '") + key + "' holds a bad entry " + e.dump());
      out.push_back(static_cast<int>(e.get<int64_t>()));
    }
    return Status::Ok();
  };
  if (j.contains("stage_of_layer")) {
    CKPT_RETURN_IF_ERROR(int_list("stage_of_layer", l.stage_of_layer));
  } else if (j.contains("layers_per_stage")) {
    std::vector<int> per;
    CKPT_RETURN_IF_ERROR(int_list("layers_per_stage", per));
    if (static_cast<int64_t>(per.size()) != pp)
      return bad("layers_per_stage has " + std::to_string(per.size()) + " entries, pp is " + std::to_string(pp));
    int64_t total = 0;
    for (int n : per) total += n;
    if (total > kMaxParallel) return bad("layers_per_stage sums to too many layers");
    for (int s = 0; s < static_cast<int>(per.size()); ++s) l.stage_of_layer.insert(l.stage_of_layer.end(), per[s], s);
  } else if (j.contains("num_layers")) {
    int64_t nl;
    CKPT_RETURN_IF_ERROR(get_int("num_layers", 0, true, nl));
    if (nl > kMaxParallel) return bad("num_layers too large");
    CKPT_ASSIGN_OR_RETURN(Layout even, make(l.tp, l.pp, l.dp, l.zero, static_cast<int>(nl)));
    l.stage_of_layer = even.stage_of_layer;
  } else {
    return bad("layout needs 'layers_per_stage', 'stage_of_layer' or 'num_layers'");
  }
  if (j.contains("num_layers") && j.at("num_layers").is_number_integer() &&
      j.at("num_layers").get<int64_t>() != l.num_layers())
    return bad("layout says num_layers=" + j.at("num_layers").dump() + " but its stages hold " +
               std::to_string(l.num_layers()) + " layers");
  if (j.contains("micro_batch")) CKPT_RETURN_IF_ERROR(int_list("micro_batch", l.micro_batch));
  if (j.contains("profile")) {
    if (!j.at("profile").is_string()) return bad("layout key 'profile' must be a string");
    l.profile = j.at("profile").get<std::string>();
  }
  if (j.contains("rank_order") && j.at("rank_order") != "tp-dp-pp")
    return Status::Unsupported("layout rank_order " + j.at("rank_order").dump() + " (only \"tp-dp-pp\")");
  CKPT_RETURN_IF_ERROR(l.validate());
  return l;
}

std::string Layout::to_string() const {
  if (!symmetric()) return general_to_string(*this);
  std::string s = "tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) + " [";
  std::vector<int> per(static_cast<size_t>(std::max(pp, 0)), 0);
  for (int st : stage_of_layer)
    if (st >= 0 && st < pp) ++per[st];
  for (size_t i = 0; i < per.size(); ++i) s += (i ? "," : "") + std::to_string(per[i]);
  s += "] dp=" + std::to_string(dp) + " zero=" + std::to_string(zero);
  if (expert_parallel()) s += " ep=" + std::to_string(ep) + " etp=" + std::to_string(expert_tp());
  return s;
}

}  // namespace ckpt
