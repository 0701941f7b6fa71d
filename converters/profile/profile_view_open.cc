// The profile views of a checkpoint from its metadata (converters/profile/profile_view.h).
#include <map>
#include <set>

#include "converters/profile/profile_view.h"

namespace ckpt {

Result<Profile> profile_of_metadata(const nlohmann::json& md, const std::string& origin) {
  if (md.contains("profile_spec") && md["profile_spec"].is_object())
    return profile_from_json(md["profile_spec"], "profile_spec of " + origin);
  if (md.contains("profile") && md["profile"].is_string()) {
    auto p = builtin_profile(md["profile"].get<std::string>());
    if (!p.ok()) return p.take_status().with_context(origin);
    return p;
  }
  return builtin_profile("reference");
}

Result<std::vector<TensorMeta>> canonical_tensors_of(const Profile& p, const LlamaConfig& config,
                                                     const std::vector<TensorMeta>& stored, int tp) {
  std::vector<TensorMeta> model = llama_model_tensors(config, config.dtype);
  CKPT_ASSIGN_OR_RETURN(std::vector<ProfileTensor> pts, profile_tensors(p, config, model, tp));
  std::map<std::string, const ProfileTensor*> by_name;
  for (const ProfileTensor& t : pts) by_name[t.name] = &t;
  // kind ("optimizer.exp_avg.") -> canonical parameters covered, with the stored dtype.
  std::vector<std::string> kinds;
  std::map<std::string, std::map<std::string, DType>> covered;
  for (const TensorMeta& t : stored) {
    if (!t.name.starts_with("optimizer.")) continue;
    const size_t dot = t.name.find('.', 10);
    if (dot == std::string::npos) continue;
    const std::string kind = t.name.substr(0, dot + 1);
    auto it = by_name.find(t.name.substr(dot + 1));
    if (it == by_name.end()) continue;  // make_canonical_view names it
    if (!covered.count(kind)) kinds.push_back(kind);
    for (const ProfileSegment& s : it->second->segments)
      if (!s.canonical.empty()) covered[kind].emplace(s.canonical, t.dtype);
  }
  std::vector<TensorMeta> out = model;
  for (const std::string& kind : kinds)
    for (const TensorMeta& m : model) {
      auto c = covered[kind].find(m.name);
      if (c != covered[kind].end()) out.push_back({kind + m.name, c->second, m.shape});
    }
  return out;
}

namespace {

Result<int> profile_view_tp(const nlohmann::json& md, const std::string& origin) {
  if (!md.contains("layout")) return 1;
  const nlohmann::json& l = md["layout"];
  if (l.is_object() && l.contains("tp") && l["tp"].is_number_integer() && l["tp"].get<int64_t>() >= 1 &&
      l["tp"].get<int64_t>() <= (1 << 16))
    return static_cast<int>(l["tp"].get<int64_t>());
  return Status::Unsupported("'" + origin + "': a profile other than 'reference' needs a layout with one tp (found " +
                             l.dump().substr(0, 120) + ")");
}

}  // namespace

Result<std::unique_ptr<CanonicalView>> canonical_view(TensorSource& src, std::unique_ptr<TensorSource> owner,
                                                      const Profile& p, uint64_t tile_bytes) {
  const nlohmann::json& md = src.metadata();
  if (!md.contains("model_config"))
    return Status::Error("NoModelConfig", "'" + src.describe() + "' is stored in profile '" + p.name +
                                              "' but has no model_config: cannot map its tensors");
  auto cfg = LlamaConfig::from_json(md["model_config"]);
  if (!cfg.ok()) return cfg.take_status().with_context("model_config of '" + src.describe() + "'");
  CKPT_ASSIGN_OR_RETURN(const int tp, profile_view_tp(md, src.describe()));
  CKPT_ASSIGN_OR_RETURN(std::vector<TensorMeta> canonical, canonical_tensors_of(p, *cfg, src.tensors(), tp));
  auto pts = profile_tensors(p, *cfg, canonical, tp);
  if (!pts.ok()) return pts.take_status().with_context("'" + src.describe() + "'");
  nlohmann::json meta = md;
  meta["profile"] = "reference";
  meta["source_profile"] = p.name;
  meta.erase("profile_spec");
  if (meta.contains("layout") && meta["layout"].is_object()) meta["layout"]["profile"] = "reference";
  return make_canonical_view(src, std::move(owner), canonical, *pts, std::move(meta), tile_bytes);
}

Result<std::unique_ptr<ProfileView>> profile_view(TensorSource& canon, std::unique_ptr<TensorSource> owner,
                                                  const Profile& b, const LlamaConfig& config, int tp,
                                                  const CastOptions& cast, uint64_t tile_bytes) {
  auto pts = profile_tensors(b, config, canon.tensors(), tp);
  if (!pts.ok()) return pts.take_status().with_context("profile '" + b.name + "' of '" + canon.describe() + "'");
  nlohmann::json meta = canon.metadata();
  meta["profile"] = b.name;
  meta["profile_spec"] = b.to_json();
  meta.erase("source_profile");
  meta.erase("exactness");
  if (meta.contains("layout") && meta["layout"].is_object()) meta["layout"]["profile"] = b.name;
  return make_profile_view(canon, std::move(owner), *pts, std::move(meta), cast, tile_bytes);
}

}  // namespace ckpt
