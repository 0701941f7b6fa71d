// The profile a training run's checkpoints are stored in (docs/TRAINER.md "Profiles").
// A cluster file's device type may name its stack's profile (reshard/dist/cluster.h "profile"). The run
// saves in the profile every rank's device type names (a type naming none counts as "reference");
// when the ranks' types name different profiles the checkpoints stay canonical ("reference").
// Dtype rule: the trainer computes and keeps its state (weights, Adam moments) in fp32, so it
// stores every tensor class in F32: the profile's names, packing, orientation and vocab padding
// are kept, its dtypes are raised to F32 (the profile is then recorded as "<name>.fp32" with its
// full spec in the manifest). The checkpoint resumes exactly; `ckpt convert --profile <name>`
// gives the stack's own dtypes, with the exactness report, when the checkpoint leaves the trainer.
// Reading (resume) goes the other way for any profile: trainer/state/dist_load.cc opens a store in a
// profile other than "reference" as its canonical view (converters/profile/profile_view.h) and reads each
// rank's held regions through it, cast to F32 (exact from BF16, F16, F8; rounded from F64), in
// the same pass as the layout change.
// Saving: DistSaver writes the canonical checkpoint as `step-XXXXXXXX.canonical`, then
// convert_saved_checkpoint runs the reshard job (converters/jobs/reshard_job.h) into `step-XXXXXXXX`
// with the profile (same layout, in its symmetric form), and `latest` moves only after that; the canonical copy is
// removed. Errors (before anything runs, naming the cluster file and the device type):
// ProfileUnknown (a name that is no built-in profile, listing them), Unsupported (a saving
// profile with a layout that is not symmetric: profile stores hold one tp), the profile's own
// ProfileUnsupported / ProfileNotSplittable for this model and layout.
// Thread safety: pure functions; convert_saved_checkpoint is collective over `world`.
#pragma once

#include <string>

#include "converters/model/llama_config.h"
#include "converters/profile/profile.h"
#include "formats/base/status.h"
#include "formats/digest/digest.h"
#include "reshard/dist/cluster.h"
#include "reshard/dist/comm.h"
#include "reshard/layout/layout.h"

namespace ckpt::trainer {

struct TrainProfile {
  bool active = false;  // false: canonical ("reference") checkpoints
  Profile profile;      // what is stored (active): the cluster's profile with F32 dtypes
  std::string named;    // the cluster's profile name ("megatron-mcore"); "" when none
  std::string note;     // one line for the start of the run ("" without a cluster file)
  Layout stored_layout; // active: the symmetric form of the run's layout (device names dropped)
};

// `p` with every class's stored dtype F32; renamed "<name>.fp32" when that changed anything.
Profile trainer_storage_profile(const Profile& p);

// Every device type's `profile` of cluster `c` (read from `cluster_file`) is a built-in profile:
// else ProfileUnknown naming the file and the device type (train and plan both check).
Status check_cluster_profiles(const Cluster& c, const std::string& cluster_file);

// The profile of a run on `layout` from the cluster file (empty: none). Validates every device
// type's profile name, then the saving profile against the model and the layout.
Result<TrainProfile> train_profile(const std::string& cluster_file, const LlamaConfig& cfg, const Layout& layout);

// Collective: the canonical checkpoint `staged` -> `dst` in the profile of the JSON file
// `profile_file`, on `layout` (TrainProfile::stored_layout, symmetric). `threads`: the job's worker
// threads; `digest` of the pieces; `budget`: the job's --max-memory in bytes (at least 4 MiB).
Status convert_saved_checkpoint(Comm& world, const std::string& staged, const std::string& dst,
                                const std::string& profile_file, const Layout& layout, int threads,
                                DigestAlgo digest, uint64_t budget);

}  // namespace ckpt::trainer
