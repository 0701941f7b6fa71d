#include "converters/source/job_source.h"

#include "formats/base/fs_util.h"
#include "formats/store/manifest.h"
#include "formats/store/run_dir.h"
#include "reshard/source_verify.h"

namespace ckpt {

JobSource JobSource::locate(const std::string& path, const std::string& source_profile) {
  JobSource s;
  s.path = path;
  s.source_profile = source_profile;
  s.dir = path;
  s.kind = detect_checkpoint(path);
  if (s.native_store()) {
    auto dir = store::resolve_checkpoint(path);
    if (dir.ok())
      s.dir = *dir;
    else
      s.resolved = dir.take_status();
  }
  return s;
}

nlohmann::json source_detected_of(const TensorSource& src) {
  const nlohmann::json& md = src.metadata();
  if (md.is_object() && md.contains("source_detected")) return md["source_detected"];
  return nullptr;
}

bool JobSource::native_store() const { return kind && kind->detect == &is_native_store; }

bool JobSource::cold(IoMode io) const { return io == IoMode::kAuto && page_cache_share(dir) < 0.5; }

bool JobSource::copy_checkable(const ProfileRequest& asked) const {
  if (!native_store() || !resolved.ok()) return false;
  auto m = store::load_manifest(dir);
  return m.ok() && copy_verifiable(*m) && !needs_profile_views(m->metadata, asked) && source_profile.empty();
}

Result<std::unique_ptr<TensorSource>> JobSource::open(bool as_stored) const {
  if (!source_profile.empty() && !(as_stored && native_store())) return open_checkpoint_in_profile(native_store() ? dir : path, source_profile);
  if (!kind) return open_checkpoint(path);  // NotFound, or Unsupported listing every kind
  if (!resolved.ok()) return resolved;
  return open_checkpoint_as(*kind, dir, as_stored);
}

}  // namespace ckpt
