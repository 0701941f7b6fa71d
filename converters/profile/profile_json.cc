// Parsing and validation of profile files (converters/profile/profile.h: the spec at the top).
#include <algorithm>
#include <map>
#include <set>

#include "converters/profile/profile.h"
#include "converters/profile/profile_kinds.h"

namespace ckpt {

namespace profile_kinds {

const std::vector<KindInfo>& all_kinds() {
  static const std::vector<KindInfo> k = {
      {"embed", false, false},       {"final_norm", false, false},  {"lm_head", false, false},
      {"input_norm", true, false},   {"post_norm", true, false},    {"q", true, false},
      {"k", true, false},            {"v", true, false},            {"qkv", true, false},
      {"o", true, false},            {"gate", true, false},         {"up", true, false},
      {"gate_up", true, false},      {"down", true, false},         {"q_bias", true, true},
      {"k_bias", true, true},        {"v_bias", true, true},        {"qkv_bias", true, true},
      {"o_bias", true, true},        {"gate_bias", true, true},     {"up_bias", true, true},
      {"gate_up_bias", true, true},  {"down_bias", true, true},
  };
  return k;
}

const KindInfo* find_kind(const std::string& kind) {
  for (const auto& k : all_kinds())
    if (kind == k.kind) return &k;
  return nullptr;
}

std::vector<std::string> weight_kinds(QkvPacking qkv, MlpPacking mlp) {
  std::vector<std::string> k = {"embed", "final_norm", "lm_head", "input_norm", "post_norm", "o", "down"};
  if (qkv == QkvPacking::kSeparate) k.insert(k.end(), {"q", "k", "v"});
  else k.push_back("qkv");
  if (mlp == MlpPacking::kSeparate) k.insert(k.end(), {"gate", "up"});
  else k.push_back("gate_up");
  return k;
}

std::vector<std::string> attention_bias_kinds(QkvPacking qkv) {
  if (qkv == QkvPacking::kSeparate) return {"q_bias", "k_bias", "v_bias", "o_bias"};
  return {"qkv_bias", "o_bias"};
}

std::vector<std::string> mlp_bias_kinds(MlpPacking mlp) {
  if (mlp == MlpPacking::kSeparate) return {"gate_bias", "up_bias", "down_bias"};
  return {"gate_up_bias", "down_bias"};
}

}  // namespace profile_kinds

namespace profile_json_detail {

using nlohmann::json;

constexpr size_t kMaxPatternChars = 256;
constexpr size_t kMaxNameChars = 64;
constexpr int64_t kMaxMultiple = int64_t{1} << 20;
constexpr size_t kMaxSources = 64;

struct ProfileParser {
  const std::string& origin;

  Status err(const char* code, const std::string& field, const std::string& expected, const std::string& found) const {
    return Status::Error(code, "profile " + origin + ": field '" + field + "': expected " + expected + ", found " + found);
  }
  static std::string show(const json& v) {
    std::string s = v.dump();
    if (s.size() > 80) s = s.substr(0, 77) + "...";
    return std::string(v.type_name()) + " " + s;
  }
  Status unknown_keys(const json& obj, const std::string& where, const std::vector<std::string>& known) const {
    for (const auto& [k, v] : obj.items())
      if (std::find(known.begin(), known.end(), k) == known.end()) {
        std::string list;
        for (const auto& n : known) list += (list.empty() ? "" : ", ") + n;
        return err("ProfileUnknownField", where.empty() ? k : where + "." + k, "one of the keys " + list,
                   "an unknown key");
      }
    return Status::Ok();
  }
  Result<std::string> string_field(const json& obj, const std::string& key, const std::string& where, bool required,
                                   size_t max_chars) const {
    const std::string field = where.empty() ? key : where + "." + key;
    auto it = obj.find(key);
    if (it == obj.end()) {
      if (required) return err("ProfileBadValue", field, "a string", "nothing (the field is required)");
      return std::string();
    }
    if (!it->is_string()) return err("ProfileBadValue", field, "a string", show(*it));
    const std::string s = it->get<std::string>();
    if (s.size() > max_chars)
      return err("ProfileBadValue", field, "at most " + std::to_string(max_chars) + " characters",
                 std::to_string(s.size()));
    return s;
  }

  Status parse_name(const json& j, Profile& p) const {
    CKPT_ASSIGN_OR_RETURN(p.name, string_field(j, "name", "", true, kMaxNameChars));
    const bool ok = !p.name.empty() && std::all_of(p.name.begin(), p.name.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    });
    if (!ok) return err("ProfileBadValue", "name", "a non-empty name of [a-z0-9._-]", "\"" + p.name + "\"");
    CKPT_ASSIGN_OR_RETURN(p.description, string_field(j, "description", "", false, 1000));
    return Status::Ok();
  }

  Status parse_dtypes(const json& j, Profile& p) const {
    auto it = j.find("dtypes");
    if (it == j.end()) return err("ProfileBadValue", "dtypes", "an object", "nothing (the field is required)");
    if (!it->is_object()) return err("ProfileBadValue", "dtypes", "an object", show(*it));
    CKPT_RETURN_IF_ERROR(unknown_keys(*it, "dtypes", {"weight", "norm", "embedding", "optimizer"}));
    const std::pair<const char*, std::optional<DType>*> fields[] = {
        {"weight", &p.dtype_weight}, {"norm", &p.dtype_norm}, {"embedding", &p.dtype_embedding},
        {"optimizer", &p.dtype_optimizer}};
    for (const auto& [key, dst] : fields) {
      CKPT_ASSIGN_OR_RETURN(const std::string s, string_field(*it, key, "dtypes", true, 16));
      if (s == "keep") {
        dst->reset();
        continue;
      }
      auto dt = dtype_from_name(s, /*cli_aliases=*/true);
      if (!dt.ok() || !dtype_is_float(*dt))
        return err("ProfileBadValue", std::string("dtypes.") + key,
                   "\"keep\" or a float dtype (BF16, F16, F32, F64, F8_E4M3, F8_E5M2, bf16, fp16, fp32, fp64)",
                   "\"" + s + "\"");
      *dst = *dt;
    }
    return Status::Ok();
  }

  Status parse_vocab(const json& j, Profile& p) const {
    auto it = j.find("vocab_padding");
    if (it == j.end()) return Status::Ok();
    if (!it->is_object()) return err("ProfileBadValue", "vocab_padding", "an object", show(*it));
    CKPT_RETURN_IF_ERROR(unknown_keys(*it, "vocab_padding", {"multiple", "scales_with_tp"}));
    if (auto m = it->find("multiple"); m != it->end()) {
      if (!m->is_number_integer() || m->get<int64_t>() < 1 || m->get<int64_t>() > kMaxMultiple)
        return err("ProfileBadValue", "vocab_padding.multiple", "an integer in [1, " + std::to_string(kMaxMultiple) + "]",
                   show(*m));
      p.vocab.multiple = m->get<int64_t>();
    }
    if (auto s = it->find("scales_with_tp"); s != it->end()) {
      if (!s->is_boolean()) return err("ProfileBadValue", "vocab_padding.scales_with_tp", "true or false", show(*s));
      p.vocab.scales_with_tp = s->get<bool>();
    }
    return Status::Ok();
  }

  template <typename E>
  Result<E> parse_enum(const json& j, const std::string& key, const std::vector<std::pair<const char*, E>>& values) const {
    CKPT_ASSIGN_OR_RETURN(const std::string s, string_field(j, key, "", true, 64));
    std::string list;
    for (const auto& [n, e] : values) {
      if (s == n) return e;
      list += (list.empty() ? "" : ", ") + std::string(n);
    }
    return err("ProfileBadValue", key, "one of " + list, "\"" + s + "\"");
  }

  Status check_pattern(const std::string& kind, const std::string& pat, bool per_layer) const {
    const std::string field = "names." + kind;
    if (pat.empty()) return err("ProfileBadValue", field, "a non-empty tensor name pattern", "\"\"");
    for (char c : pat)
      if (c <= ' ' || c > '~')
        return err("ProfileBadValue", field, "printable ASCII without spaces", "\"" + pat + "\"");
    size_t count = 0;
    for (size_t pos = 0; (pos = pat.find('{', pos)) != std::string::npos; ++pos) {
      if (pat.compare(pos, 3, "{i}") != 0)
        return err("ProfileBadValue", field, "no '{' other than the layer placeholder {i}", "\"" + pat + "\"");
      ++count;
    }
    if (std::count(pat.begin(), pat.end(), '}') != static_cast<std::ptrdiff_t>(count))
      return err("ProfileBadValue", field, "no '}' other than the layer placeholder {i}", "\"" + pat + "\"");
    if (per_layer && count != 1)
      return err("ProfileBadValue", field, "a per-layer pattern holding {i} exactly once", "\"" + pat + "\"");
    if (!per_layer && count != 0)
      return err("ProfileBadValue", field, "a model-level pattern without {i}", "\"" + pat + "\"");
    return Status::Ok();
  }

  Status parse_names(const json& j, Profile& p) const {
    auto it = j.find("names");
    if (it == j.end()) return err("ProfileBadValue", "names", "an object", "nothing (the field is required)");
    if (!it->is_object()) return err("ProfileBadValue", "names", "an object", show(*it));
    std::map<std::string, std::string> by_pattern;
    for (const auto& info : profile_kinds::all_kinds()) {  // kind order, whatever the file's
      auto n = it->find(info.kind);
      if (n == it->end()) continue;
      if (!n->is_string()) return err("ProfileBadValue", std::string("names.") + info.kind, "a string", show(*n));
      const std::string pat = n->get<std::string>();
      if (pat.size() > kMaxPatternChars)
        return err("ProfileBadValue", std::string("names.") + info.kind,
                   "at most " + std::to_string(kMaxPatternChars) + " characters", std::to_string(pat.size()));
      CKPT_RETURN_IF_ERROR(check_pattern(info.kind, pat, info.per_layer));
      if (auto [d, inserted] = by_pattern.emplace(pat, info.kind); !inserted)
        return err("ProfileDuplicateName", std::string("names.") + info.kind,
                   "a pattern of its own", "\"" + pat + "\", the pattern of names." + d->second);
      p.names.emplace_back(info.kind, pat);
    }
    for (const auto& [k, v] : it->items())
      if (!profile_kinds::find_kind(k)) {
        std::string list;
        for (const auto& info : profile_kinds::all_kinds()) list += (list.empty() ? "" : ", ") + std::string(info.kind);
        return err("ProfileUnknownField", "names." + k, "a tensor kind (" + list + ")", "an unknown kind");
      }
    return Status::Ok();
  }

  // Kinds against packings: contradictions (names the packings do not use), then completeness.
  Status check_kinds(const Profile& p) const {
    auto used = profile_kinds::weight_kinds(p.qkv, p.mlp);
    const auto needed = used;
    for (auto v : {profile_kinds::attention_bias_kinds(p.qkv), profile_kinds::mlp_bias_kinds(p.mlp)})
      used.insert(used.end(), v.begin(), v.end());
    for (const auto& [kind, pat] : p.names)
      if (std::find(used.begin(), used.end(), kind) == used.end())
        return err("ProfileContradiction", "names." + kind,
                   std::string("no name for this kind with qkv_packing \"") + qkv_packing_name(p.qkv) +
                       "\" and mlp_packing \"" + mlp_packing_name(p.mlp) + "\"",
                   "\"" + pat + "\"");
    for (const auto& kind : needed)
      if (p.pattern(kind).empty())
        return err("ProfileIncompleteNaming", "names." + kind,
                   std::string("a name (qkv_packing \"") + qkv_packing_name(p.qkv) + "\", mlp_packing \"" +
                       mlp_packing_name(p.mlp) + "\" need it)",
                   "none");
    return Status::Ok();
  }

  Status parse_config_keys(const json& j, Profile& p) const {
    auto it = j.find("config_keys");
    if (it == j.end()) return Status::Ok();
    if (!it->is_object()) return err("ProfileBadValue", "config_keys", "an object", show(*it));
    const LlamaConfig probe;  // the canonical keys are the ones LlamaConfig writes
    nlohmann::json known = probe.to_json();
    std::map<std::string, std::string> seen;
    for (const auto& [k, v] : it->items()) {
      if (!known.contains(k)) return err("ProfileUnknownField", "config_keys." + k, "a key of HF's LLaMA config.json", "an unknown key");
      if (!v.is_string() || v.get<std::string>().empty() || v.get<std::string>().size() > kMaxNameChars)
        return err("ProfileBadValue", "config_keys." + k, "a non-empty string of at most 64 characters", show(v));
      if (auto [d, inserted] = seen.emplace(v.get<std::string>(), k); !inserted)
        return err("ProfileDuplicateName", "config_keys." + k, "a key of its own",
                   "\"" + v.get<std::string>() + "\", the key of config_keys." + d->second);
      p.config_keys.emplace_back(k, v.get<std::string>());
    }
    return Status::Ok();
  }

  Status parse_sources(const json& j, Profile& p) const {
    auto it = j.find("sources");
    if (it == j.end()) return Status::Ok();
    if (!it->is_array() || it->size() > kMaxSources)
      return err("ProfileBadValue", "sources", "an array of at most 64 strings", show(*it));
    for (const auto& s : *it) {
      if (!s.is_string() || s.get<std::string>().size() > 1000)
        return err("ProfileBadValue", "sources", "strings of at most 1000 characters", show(s));
      p.sources.push_back(s.get<std::string>());
    }
    return Status::Ok();
  }
};

const std::vector<std::pair<const char*, QkvPacking>> kQkvNames = {
    {"separate", QkvPacking::kSeparate},       {"megatron-groups", QkvPacking::kMegatronGroups},
    {"libai-heads", QkvPacking::kLibaiHeads},  {"fused-whole", QkvPacking::kFusedWhole},
    {"fused-per-tp", QkvPacking::kFusedPerTp}};
const std::vector<std::pair<const char*, MlpPacking>> kMlpNames = {
    {"separate", MlpPacking::kSeparate}, {"fused-per-tp", MlpPacking::kFusedPerTp}, {"fused-whole", MlpPacking::kFusedWhole}};
const std::vector<std::pair<const char*, Orientation>> kOrientationNames = {{"out-in", Orientation::kOutIn},
                                                                            {"in-out", Orientation::kInOut}};

template <typename E>
const char* enum_name(const std::vector<std::pair<const char*, E>>& table, E e) {
  for (const auto& [n, v] : table)
    if (v == e) return n;
  return "?";
}

}  // namespace profile_json_detail

const char* qkv_packing_name(QkvPacking p) { return profile_json_detail::enum_name(profile_json_detail::kQkvNames, p); }
const char* mlp_packing_name(MlpPacking p) { return profile_json_detail::enum_name(profile_json_detail::kMlpNames, p); }
const char* orientation_name(Orientation o) {
  return profile_json_detail::enum_name(profile_json_detail::kOrientationNames, o);
}

Result<Profile> profile_from_json(const nlohmann::json& j, const std::string& origin) {
  using namespace profile_json_detail;
  const ProfileParser ps{origin};
  if (!j.is_object()) return ps.err("ProfileBadValue", "(top level)", "a JSON object", ProfileParser::show(j));
  CKPT_RETURN_IF_ERROR(ps.unknown_keys(j, "",
                                       {"name", "description", "dtypes", "vocab_padding", "qkv_packing", "mlp_packing",
                                        "orientation", "names", "config_keys", "sources"}));
  Profile p;
  CKPT_RETURN_IF_ERROR(ps.parse_name(j, p));
  CKPT_RETURN_IF_ERROR(ps.parse_dtypes(j, p));
  CKPT_RETURN_IF_ERROR(ps.parse_vocab(j, p));
  CKPT_ASSIGN_OR_RETURN(p.qkv, ps.parse_enum(j, "qkv_packing", kQkvNames));
  CKPT_ASSIGN_OR_RETURN(p.mlp, ps.parse_enum(j, "mlp_packing", kMlpNames));
  CKPT_ASSIGN_OR_RETURN(p.orientation, ps.parse_enum(j, "orientation", kOrientationNames));
  CKPT_RETURN_IF_ERROR(ps.parse_names(j, p));
  CKPT_RETURN_IF_ERROR(ps.check_kinds(p));
  CKPT_RETURN_IF_ERROR(ps.parse_config_keys(j, p));
  CKPT_RETURN_IF_ERROR(ps.parse_sources(j, p));
  return p;
}

nlohmann::json Profile::to_json() const {
  nlohmann::json j;
  j["name"] = name;
  if (!description.empty()) j["description"] = description;
  auto dt = [](const std::optional<DType>& d) { return d ? std::string(dtype_name(*d)) : std::string("keep"); };
  j["dtypes"] = {{"weight", dt(dtype_weight)}, {"norm", dt(dtype_norm)}, {"embedding", dt(dtype_embedding)},
                 {"optimizer", dt(dtype_optimizer)}};
  j["vocab_padding"] = {{"multiple", vocab.multiple}, {"scales_with_tp", vocab.scales_with_tp}};
  j["qkv_packing"] = qkv_packing_name(qkv);
  j["mlp_packing"] = mlp_packing_name(mlp);
  j["orientation"] = orientation_name(orientation);
  j["names"] = nlohmann::json::object();
  for (const auto& [k, v] : names) j["names"][k] = v;
  if (!config_keys.empty()) {
    j["config_keys"] = nlohmann::json::object();
    for (const auto& [k, v] : config_keys) j["config_keys"][k] = v;
  }
  if (!sources.empty()) j["sources"] = sources;
  return j;
}

}  // namespace ckpt
