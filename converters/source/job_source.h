// A job's SRC found once, before anything opens it: its kind (the one table of
// converters/source/open_checkpoint.h, asked once) and, for a native store, its checkpoint directory
// (a run dir's `latest` followed once, so that the page-cache probe, the source check's child
// process and the open all see the same checkpoint). What a job asks of SRC before it opens it
// (cold in the page cache? checkable from a copy's reads?) is asked here; then open() opens it once.
// Used by the jobs that read a SRC: reshard, to-hf, from-hf and the exports (converters/jobs/reshard_job.h,
// converters/jobs/hf_jobs.h, converters/jobs/export_jobs.h).
// Thread safety: plain values; open() is reentrant.
#pragma once

#include <memory>
#include <string>

#include "converters/profile/profile_view_job.h"
#include "converters/source/open_checkpoint.h"
#include "formats/base/io_mode.h"
#include "formats/base/status.h"
#include "formats/tensor/tensor_io.h"

namespace ckpt {

// What a source says it was detected as (a PaddleNLP directory, a source read in a
// --source-profile): its metadata's "source_detected" ({kind, files, profile, dtype, why}); null
// for the kinds that need no such word.
nlohmann::json source_detected_of(const TensorSource& src);

struct JobSource {
  std::string path;                      // SRC as given (messages)
  std::string dir;                       // what is opened: a native store's checkpoint dir, else `path`
  const CheckpointKind* kind = nullptr;  // null: no kind recognises `path` (open() says why)
  Status resolved;                       // a native store whose checkpoint cannot be resolved: why (open() returns it)
  std::string source_profile;            // --source-profile: SRC's tensors are stored in this profile

  // Detects the kind of `path` and resolves a native store's checkpoint; never fails (open() does).
  // `source_profile` (--source-profile NAME, may be empty): open() reads SRC in that profile
  // (open_checkpoint_in_profile).
  static JobSource locate(const std::string& path, const std::string& source_profile = "");

  bool native_store() const;
  // --io auto (`io` kAuto): whether SRC is mostly out of the page cache (page_cache_share < 0.5),
  // so that direct reads beat mapped ones. False for the other modes.
  bool cold(IoMode io) const;
  // Whether SRC can be checked from a copy's own direct reads (CopyVerify): a native store whose
  // every piece is stored uncompressed, copied as stored (neither stored in a profile nor converted
  // to the one `asked`: profile views compute their pieces, they do not copy file ranges). Reads
  // the manifest.
  bool copy_checkable(const ProfileRequest& asked = {}) const;
  // Opens SRC as its kind (open_checkpoint's source: a native store in a profile as its canonical
  // view), or with `as_stored` a native store as stored; with a source_profile in that profile
  // (open_checkpoint_in_profile). Errors as open_checkpoint's.
  Result<std::unique_ptr<TensorSource>> open(bool as_stored = false) const;
};

}  // namespace ckpt
