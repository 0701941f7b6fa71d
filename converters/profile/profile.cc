// Profile values, the built-in profiles (profiles/*.json, compiled in by CMake) and loading.
#include "converters/profile/profile.h"

#include <algorithm>

#include "converters/profile/profile_builtin_data.h"
#include "formats/base/json_read.h"

namespace ckpt {

namespace {

constexpr JsonLimits kProfileJsonLimits{uint64_t{1} << 20, 8};

}  // namespace

int64_t VocabPadding::padded(int64_t vocab, int tp) const {
  const int64_t m = multiple * (scales_with_tp ? std::max(tp, 1) : 1);
  if (m <= 1 || vocab <= 0) return vocab;
  return (vocab + m - 1) / m * m;
}

DType Profile::stored_dtype(TensorClass c, DType src) const {
  const std::optional<DType>* d = &dtype_weight;
  switch (c) {
    case TensorClass::kWeight: d = &dtype_weight; break;
    case TensorClass::kNorm: d = &dtype_norm; break;
    case TensorClass::kEmbedding: d = &dtype_embedding; break;
    case TensorClass::kOptimizer: d = &dtype_optimizer; break;
  }
  // Only float tensors take the profile's dtype; "keep" (nullopt) and non-float sources stay.
  return (*d && dtype_is_float(src)) ? **d : src;
}

std::string Profile::pattern(const std::string& kind) const {
  for (const auto& [k, v] : names)
    if (k == kind) return v;
  return "";
}

const char* tensor_class_name(TensorClass c) {
  switch (c) {
    case TensorClass::kWeight: return "weight";
    case TensorClass::kNorm: return "norm";
    case TensorClass::kEmbedding: return "embedding";
    case TensorClass::kOptimizer: return "optimizer";
  }
  return "?";
}

Shape ProfileTensor::untransposed_shape() const {
  Shape s = shape;
  if (transposed) std::reverse(s.begin(), s.end());
  return s;
}

std::vector<ProfileSegment> profile_segments_in(const ProfileTensor& t, const Box& box) {
  std::vector<ProfileSegment> out;
  if (box.ndim() == 0) {  // a rank-0 tensor: its one segment
    for (const auto& s : t.segments) out.push_back(s);
    return out;
  }
  const int64_t lo = box.offset[0], hi = box.offset[0] + box.extent[0];
  int64_t row = 0;
  for (const auto& s : t.segments) {
    const int64_t n = s.rows(), a = std::max(row, lo), b = std::min(row + n, hi);
    if (a < b) {
      ProfileSegment piece;
      if (s.canonical.empty()) {
        piece.zero_rows = b - a;
      } else {
        piece.canonical = s.canonical;
        piece.box = s.box;
        piece.box.offset[0] += a - row;
        piece.box.extent[0] = b - a;
        for (size_t d = 1; d < box.ndim() && d < piece.box.ndim(); ++d) {
          piece.box.offset[d] += box.offset[d];
          piece.box.extent[d] = box.extent[d];
        }
      }
      out.push_back(std::move(piece));
    }
    row += n;
  }
  return out;
}

std::vector<std::string> builtin_profile_names() {
  std::vector<std::string> names;
  for (size_t i = 0; i < profile_builtin_detail::kNumBuiltinProfiles; ++i)
    names.emplace_back(profile_builtin_detail::kBuiltinProfiles[i].name);
  std::sort(names.begin(), names.end());
  return names;
}

Result<Profile> builtin_profile(const std::string& name) {
  for (size_t i = 0; i < profile_builtin_detail::kNumBuiltinProfiles; ++i) {
    const auto& b = profile_builtin_detail::kBuiltinProfiles[i];
    if (name != b.name) continue;
    const std::string origin = "built-in '" + name + "' (profiles/" + name + ".json)";
    CKPT_ASSIGN_OR_RETURN(nlohmann::json j, parse_json(b.json, kProfileJsonLimits, "profile " + origin));
    CKPT_ASSIGN_OR_RETURN(Profile p, profile_from_json(j, origin));
    if (p.name != name)
      return Status::Error("ProfileBadValue", "profile " + origin + ": field 'name': expected \"" + name +
                                                  "\" (the file's name), found \"" + p.name + "\"");
    return p;
  }
  std::string list;
  for (const auto& n : builtin_profile_names()) list += (list.empty() ? "" : ", ") + n;
  return Status::Error("ProfileUnknown", "no built-in profile '" + name + "' (built-in profiles: " + list +
                                             "; a profile of your own: --profile-file FILE.json)");
}

Result<Profile> load_profile(const std::string& name, const std::string& file) {
  if (file.empty()) return builtin_profile(name);
  const std::string origin = "file '" + file + "'";
  CKPT_ASSIGN_OR_RETURN(nlohmann::json j, read_json_file(file, kProfileJsonLimits, "profile"));
  auto p = profile_from_json(j, origin);
  if (!p.ok()) return p.take_status().with_file(file);
  if (!name.empty() && p->name != name)
    return Status::Error("ProfileBadValue", "profile " + origin + ": field 'name': expected \"" + name +
                                                "\" (the name asked for), found \"" + p->name + "\"")
        .with_file(file);
  return p;
}

}  // namespace ckpt
