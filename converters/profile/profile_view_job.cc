#include "converters/profile/profile_view_job.h"

#include "converters/profile/profile_sharding.h"
#include "converters/profile/profile_view.h"
#include "formats/base/json_read.h"

namespace ckpt {

Result<Profile> load_requested_profile(const ProfileRequest& r) {
  if (!r.profile.empty() && !r.profile_file.empty())
    return Status::InvalidArgument("--profile NAME and --profile-file FILE exclude each other");
  auto p = load_profile(r.profile, r.profile_file);
  if (!p.ok())
    return p.take_status().with_context(r.profile_file.empty() ? "--profile " + r.profile
                                                               : "--profile-file " + r.profile_file);
  if (r.dtype) p->dtype_weight = p->dtype_norm = p->dtype_embedding = *r.dtype;  // asked for: the profile's "keep" or its own dtype overridden
  return p;
}

bool needs_profile_views(const nlohmann::json& md, const ProfileRequest& r) {
  if (r.given()) return true;
  if (md.contains("profile_spec")) return true;
  return md.contains("profile") && md["profile"].is_string() && md["profile"] != "reference";
}

namespace {

// The overflow refusal: every tensor that clamped something, with its count.
Status overflow_refusal(const ExactnessReport& rep, const Profile& to) {
  std::string list;
  uint64_t total = 0;
  for (const ExactnessEntry& e : rep.entries()) {
    if (e.clamped == 0) continue;
    total += e.clamped;
    list += "\n  tensor '" + e.tensor + "'" + (e.stored_as.empty() || e.stored_as == e.tensor ? "" : " (stored as '" + e.stored_as + "')") +
            ": " + e.step + ": " + std::to_string(e.clamped) + " of " + std::to_string(e.elements) +
            " elements beyond the target's max finite";
  }
  return Status::Error("CastOverflow", "converting to profile '" + to.name + "' overflows " + std::to_string(total) +
                                           " elements (nothing was written; --saturate clamps them to the max finite "
                                           "and reports the counts):" + list);
}

class ProfileConversionImpl final : public ProfileConversion {
 public:
  TensorSource& source() override { return *view_; }
  const ShardingRules& rules() const override { return *rules_; }
  const Profile& target() const override { return to_; }
  const Profile& from() const override { return from_; }

  std::string process_note() const override {
    ExactnessReport r = view_->report();
    r.merge(padding_);
    return r.to_json().dump();
  }

  Status amend(const std::vector<std::string>& notes, nlohmann::json& md) override {
    ExactnessReport all;
    for (size_t i = 0; i < notes.size(); ++i) {
      const std::string origin = "reshard process " + std::to_string(i);
      CKPT_ASSIGN_OR_RETURN(nlohmann::json j, parse_json(notes[i], JsonLimits{uint64_t{1} << 30, 8}, origin));
      CKPT_ASSIGN_OR_RETURN(ExactnessReport r, ExactnessReport::from_json(j, origin));
      all.merge(r);
    }
    merged_ = all;
    have_merged_ = true;
    bool clamped = false;
    for (const ExactnessEntry& e : all.entries()) clamped = clamped || e.clamped > 0;
    if (clamped && !saturate_) return overflow_refusal(all, to_);
    md["exactness"] = all.to_json();
    md["exactness"]["from_profile"] = from_.name;
    md["exactness"]["saturate"] = saturate_;
    return Status::Ok();
  }

  ExactnessReport report() const override {
    if (have_merged_) return merged_;
    ExactnessReport r = view_->report();
    r.merge(padding_);
    return r;
  }

  static Result<std::unique_ptr<ProfileConversion>> make(TensorSource& src, const ProfileRequest& r,
                                                         const LlamaConfig& cfg, Layout& layout, bool root,
                                                         uint64_t tile) {
    auto c = std::unique_ptr<ProfileConversionImpl>(new ProfileConversionImpl());
    c->saturate_ = r.saturate;
    CKPT_ASSIGN_OR_RETURN(c->from_, profile_of_metadata(src.metadata(), src.describe()));
    if (r.given()) {
      CKPT_ASSIGN_OR_RETURN(c->to_, load_requested_profile(r));
    } else {
      c->to_ = c->from_;
    }
    CKPT_ASSIGN_OR_RETURN(c->canon_, canonical_view(src, nullptr, c->from_, tile));
    if (root) CKPT_RETURN_IF_ERROR(c->canon_->check_padding(c->padding_));
    auto sym = layout.as_symmetric("a profile conversion");
    if (!sym.ok()) return sym.take_status();
    layout.profile = c->to_.name;
    CastOptions cast;
    cast.overflow = r.saturate ? OverflowPolicy::kSaturate : OverflowPolicy::kError;
    CKPT_ASSIGN_OR_RETURN(c->view_, profile_view(*c->canon_, nullptr, c->to_, cfg, layout.tp, cast, tile));
    c->rules_ = std::make_unique<ProfileShardingRules>(cfg, c->view_->stored_tensors());
    CKPT_RETURN_IF_ERROR(c->rules_->check_layout(layout));
    return std::unique_ptr<ProfileConversion>(std::move(c));
  }

 private:
  ProfileConversionImpl() = default;

  Profile from_, to_;
  bool saturate_ = false;
  std::unique_ptr<CanonicalView> canon_;
  std::unique_ptr<ProfileView> view_;
  std::unique_ptr<ProfileShardingRules> rules_;
  ExactnessReport padding_, merged_;
  bool have_merged_ = false;
};

}  // namespace

Result<std::unique_ptr<ProfileConversion>> ProfileConversion::prepare(TensorSource& src, const ProfileRequest& r,
                                                                      const LlamaConfig& cfg, Layout& layout, bool root,
                                                                      uint64_t tile_bytes) {
  return ProfileConversionImpl::make(src, r, cfg, layout, root, tile_bytes);
}

}  // namespace ckpt
