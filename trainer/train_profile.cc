// The profile of a training run's checkpoints (trainer/train_profile.h).
#include "trainer/train_profile.h"

#include <algorithm>
#include <set>

#include "converters/jobs/reshard_job.h"
#include "converters/profile/profile_sharding.h"
#include "reshard/dist/cluster.h"
#include "trainer/optim/held_region.h"

namespace ckpt::trainer {

Profile trainer_storage_profile(const Profile& p) {
  Profile out = p;
  bool changed = false;
  for (std::optional<DType>* d : {&out.dtype_weight, &out.dtype_norm, &out.dtype_embedding, &out.dtype_optimizer}) {
    // "keep" keeps the trainer's F32; anything else becomes F32.
    if (*d && **d != DType::kF32) changed = true;
    *d = DType::kF32;
  }
  if (changed) {
    out.name = p.name + ".fp32";
    out.description = p.description + " [dtypes raised to F32 by ckpt train, the trainer's compute dtype]";
  }
  return out;
}

namespace {

// The saving profile must place every trainer tensor under the (symmetric form of the) layout.
Result<Layout> check_train_profile_fits(const Profile& p, const LlamaConfig& cfg, const Layout& layout,
                                        const std::string& where) {
  auto sym = layout.as_symmetric("saving checkpoints in profile '" + p.name + "' (" + where +
                                 "; a profile store holds one tp and one stage split: remove 'profile' from the "
                                 "cluster file to save canonical checkpoints)");
  if (!sym.ok()) return sym.take_status();
  auto pts = profile_tensors(p, cfg, trainer_tensors(cfg), sym->tp);
  if (!pts.ok()) return pts.take_status().with_context(where);
  ProfileShardingRules rules(cfg, *pts);
  CKPT_RETURN_IF_ERROR(rules.check_layout(*sym));
  for (const ProfileTensor& t : *pts) {
    auto placed = rules.place(TensorMeta{t.name, t.dtype, t.shape}, *sym);
    if (!placed.ok()) return placed.take_status().with_context(where + ", layout " + sym->to_string());
  }
  return sym;
}

}  // namespace

Status check_cluster_profiles(const Cluster& c, const std::string& cluster_file) {
  // Every named profile must exist, whether or not its type holds a rank of this run.
  for (const DeviceType& d : c.types) {
    if (d.profile.empty()) continue;
    auto p = builtin_profile(d.profile);
    if (!p.ok())
      return p.take_status()
          .with_context("cluster file '" + cluster_file + "', device type '" + d.name + "', key 'profile'")
          .with_file(cluster_file);
  }
  return Status::Ok();
}

Result<TrainProfile> train_profile(const std::string& cluster_file, const LlamaConfig& cfg, const Layout& layout) {
  TrainProfile out;
  if (cluster_file.empty()) return out;
  CKPT_ASSIGN_OR_RETURN(Cluster c, Cluster::from_file(cluster_file));
  CKPT_RETURN_IF_ERROR(check_cluster_profiles(c, cluster_file));
  std::set<std::string> used;
  const int n = std::min(c.world_size(), layout.world_size());
  for (int r = 0; r < n; ++r) {
    const std::string& name = c.device_of(r).profile;
    used.insert(name.empty() ? "reference" : name);
  }
  if (used.size() != 1) {
    std::string list;
    for (const std::string& s : used) list += (list.empty() ? "" : ", ") + s;
    out.note = "checkpoints: canonical (profile 'reference'): the ranks' device types name different profiles (" +
               list + ")";
    return out;
  }
  out.named = *used.begin();
  if (out.named == "reference") {
    out.note = "checkpoints: canonical (profile 'reference')";
    return out;
  }
  CKPT_ASSIGN_OR_RETURN(Profile named, builtin_profile(out.named));
  out.profile = trainer_storage_profile(named);
  CKPT_ASSIGN_OR_RETURN(out.stored_layout,
                        check_train_profile_fits(out.profile, cfg, layout,
                                                 "profile '" + out.named + "' of cluster file '" + cluster_file + "'"));
  out.active = true;
  out.note = "checkpoints: profile '" + out.profile.name + "' (the cluster's '" + out.named + "'" +
             (out.profile.name == out.named ? std::string() : std::string(", dtypes raised to F32")) + ")";
  return out;
}

Status convert_saved_checkpoint(Comm& world, const std::string& staged, const std::string& dst,
                                const std::string& profile_file, const Layout& layout, int threads,
                                DigestAlgo digest, uint64_t budget) {
  ReshardRequest req;
  req.src = staged;
  req.dst = dst;
  // The symmetric form as flags (a device-named general layout is stored as its symmetric form).
  req.layout.tp = layout.tp;
  req.layout.pp = layout.pp;
  req.layout.dp = layout.dp;
  req.layout.zero = layout.zero;
  for (int s = 0; s < layout.pp; ++s) req.layout.pp_layers.push_back(layout.layers_in_stage(s));
  req.profile.profile_file = profile_file;
  req.threads = std::max(1, threads);
  req.store.digest = digest;
  req.no_verify = true;  // written and hashed just now by this run
  req.max_memory = std::max<uint64_t>(budget, uint64_t{4} << 20);
  req.dist = world.size() > 1 ? &world : nullptr;
  auto r = run_reshard_job(req);
  if (!r.ok()) return r.take_status().with_context("saving '" + dst + "' in the cluster's profile");
  return Status::Ok();
}

}  // namespace ckpt::trainer
