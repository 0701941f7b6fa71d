// The profile side of a reshard job (docs/PROFILES.md): when a profile is asked for (`ckpt convert`,
// `reshard --profile`) or the source is stored in a profile other than "reference", the job plans
// and executes from the target profile's view of the source's canonical view
// (converters/profile/profile_view.h) with the target profile's sharding rules
// (converters/profile/profile_sharding.h), so changing profile and layout is one streaming pass.
// The exactness report: each process's casts (and rank 0's dropped-padding check) are gathered to
// rank 0 (StoreExecOptions::process_note / amend_metadata), merged, refused when something
// overflowed without saturate (CastOverflow naming every tensor and count; nothing is committed),
// and written in the manifest as "exactness" beside "profile" and "profile_spec".
// Thread safety: one job at a time.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "converters/model/llama_config.h"
#include "converters/profile/exactness.h"
#include "converters/profile/profile.h"
#include "formats/base/status.h"
#include "formats/tensor/tensor_io.h"
#include "reshard/layout/layout.h"
#include "reshard/layout/sharding.h"

namespace ckpt {

struct ProfileRequest {
  std::string profile;       // a built-in profile name (--profile); empty: keep the source's
  std::string profile_file;  // a profile JSON file (--profile-file); excludes `profile`
  bool saturate = false;     // clamp values beyond the target dtype's range (reported) instead of failing
  std::optional<DType> dtype;  // --dtype with a profile: its weight, norm and embedding dtypes set to this

  bool given() const { return !profile.empty() || !profile_file.empty(); }
};

// The profile a request names; errors name the flag. Call before anything is written.
Result<Profile> load_requested_profile(const ProfileRequest& r);

// True when a reshard of a source with metadata `md` must go through the profile views.
bool needs_profile_views(const nlohmann::json& md, const ProfileRequest& r);

class ProfileConversion {
 public:
  // Views of `src` (stored in the profile its metadata names) in the requested profile (or the
  // source's) for `layout`, whose profile is set to the target's. `root`: this process checks the
  // dropped padding rows (once per job). `tile_bytes`: transpose and cast tiles.
  static Result<std::unique_ptr<ProfileConversion>> prepare(TensorSource& src, const ProfileRequest& r,
                                                            const LlamaConfig& cfg, Layout& layout, bool root,
                                                            uint64_t tile_bytes);
  virtual ~ProfileConversion() = default;
  virtual TensorSource& source() = 0;              // the target profile's view
  virtual const ShardingRules& rules() const = 0;  // the target profile's sharding rules
  virtual const Profile& target() const = 0;
  virtual const Profile& from() const = 0;
  // This process's report (JSON text) after its files are written.
  virtual std::string process_note() const = 0;
  // Rank 0: merges every process's note, refuses overflow without saturate, sets md["exactness"].
  virtual Status amend(const std::vector<std::string>& notes, nlohmann::json& md) = 0;
  // The merged report (rank 0 after amend; otherwise this process's).
  virtual ExactnessReport report() const = 0;
};

}  // namespace ckpt
