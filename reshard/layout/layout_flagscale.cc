// FlagScale's heterogeneous arguments (FlagOpen/FlagScale): hetero_process_meshes is a flat list
// of per-mesh tuples, [tp, cp, dp, pp] in the first releases (megatron/megatron/training/
// arguments.py, mid 2024: "length ... should be divisible by 4", every mesh's dp equal) and
// [tp, cp, ep, dp, pp] since (flagscale/train/arguments.py); hetero_device_types names one device
// type per mesh, so the tuple length is len(meshes) / len(device types). The layers of every
// pipeline stage (in mesh order) are hetero_pipeline_layer_split. Micro-batches: micro_batch_size
// (every pipeline) or FlagScale's hetero_micro_batch_sizes pairs [n0, mbs0, n1, mbs1, ...] (n_i
// consecutive data-parallel ranks with micro-batch mbs_i; the sum of the n_i is dp). Expert
// parallelism: a mesh's ep, its expert tensor-parallel size from
// expert_tensor_parallel_size_per_process_mesh (one per mesh), else expert_tensor_parallel_size,
// else the mesh's tp (FlagScale's ParallelContext.build_all_process_meshes); every stage of the mesh
// takes them (its experts over the mesh's tp x dp ranks, Megatron-Core's tp-ep-dp order).
#include "reshard/layout/layout_flagscale.h"

#include <limits>

namespace ckpt {

namespace {

Status bad_flagscale(const std::string& msg) { return Status::Error("BadLayout", msg); }

constexpr int64_t kFlagScaleMax = 1 << 20;

Status flagscale_ints(const nlohmann::json& j, const char* key, std::vector<int>& out, bool nested_ok) {
  auto it = j.find(key);
  if (it == j.end()) return Status::Ok();
  if (!it->is_array() || it->empty())
    return bad_flagscale(std::string("FlagScale layout key '") + key + "' must be a non-empty list of integers, got " +
               it->dump());
  for (const auto& e : *it) {
    if (nested_ok && e.is_array()) {  // [[tp, cp, dp, pp], ...] as the auto-tuner writes them
      CKPT_RETURN_IF_ERROR(flagscale_ints(nlohmann::json{{key, e}}, key, out, false));
      continue;
    }
    if (!e.is_number_integer() || e.get<int64_t>() < 1 || e.get<int64_t>() > kFlagScaleMax)
      return bad_flagscale(std::string("FlagScale layout key '") + key + "' holds " + e.dump() + ", expected integers in 1.." +
                 std::to_string(kFlagScaleMax));
    out.push_back(static_cast<int>(e.get<int64_t>()));
  }
  return Status::Ok();
}

Status flagscale_keys(const nlohmann::json& j) {
  static const char* const kKeys[] = {
      "hetero_process_meshes", "hetero_device_types", "hetero_pipeline_layer_split", "hetero_micro_batch_sizes",
      "hetero_current_device_type", "hetero_use_cpu_communication", "enable_hetero", "standalone_embedding_stage",
      "micro_batch_size", "num_layers", "use_distributed_optimizer", "make_vocab_size_divisible_by", "profile",
      "expert_tensor_parallel_size", "expert_tensor_parallel_size_per_process_mesh"};
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool ok = false;
    for (const char* k : kKeys) ok = ok || it.key() == k;
    if (!ok) return bad_flagscale("FlagScale layout has an unknown key '" + it.key() + "'");
  }
  return Status::Ok();
}

struct FlagScaleMesh {
  int tp = 1, cp = 1, ep = 1, dp = 1, pp = 1, etp = 0;  // etp 0: = tp
  std::string device;
};

Result<std::vector<FlagScaleMesh>> flagscale_meshes(const nlohmann::json& j) {
  std::vector<int> flat;
  CKPT_RETURN_IF_ERROR(flagscale_ints(j, "hetero_process_meshes", flat, true));
  auto dt = j.find("hetero_device_types");
  if (dt == j.end() || !dt->is_array() || dt->empty())
    return bad_flagscale("FlagScale layout needs 'hetero_device_types': one device type name per process mesh");
  const size_t n = dt->size();
  if (flat.size() % n != 0 || (flat.size() / n != 4 && flat.size() / n != 5))
    return bad_flagscale("FlagScale layout: 'hetero_process_meshes' has " + std::to_string(flat.size()) + " entries for " +
               std::to_string(n) + " device types; expected 4 per mesh [tp, cp, dp, pp] or 5 [tp, cp, ep, dp, pp]");
  const size_t w = flat.size() / n;
  std::vector<FlagScaleMesh> out;
  for (size_t m = 0; m < n; ++m) {
    const int* v = flat.data() + m * w;
    FlagScaleMesh mesh;
    mesh.tp = v[0];
    mesh.cp = v[1];
    mesh.ep = w == 5 ? v[2] : 1;
    mesh.dp = v[w - 2];
    mesh.pp = v[w - 1];
    const nlohmann::json& d = (*dt)[m];
    if (!d.is_string() || d.get<std::string>().empty() || d.get<std::string>().size() > 256)
      return bad_flagscale("FlagScale layout: hetero_device_types[" + std::to_string(m) + "] must be a non-empty name, got " +
                 d.dump());
    mesh.device = d.get<std::string>();
    const std::string ctx = "FlagScale layout: process mesh " + std::to_string(m) + " (" + mesh.device + ")";
    if (mesh.cp != 1)
      return Status::Unsupported(ctx + " has cp=" + std::to_string(mesh.cp) +
                                 ": context parallelism is not supported (cp must be 1)");
    if (!out.empty() && mesh.dp != out[0].dp)
      return Status::Unsupported(
          ctx + " has dp=" + std::to_string(mesh.dp) + ", process mesh 0 (" + out[0].device + ") dp=" +
          std::to_string(out[0].dp) + ": every mesh must have the same dp (a pipeline is one data-parallel replica "
          "through every stage; FlagScale's rescaling of micro-batches between meshes of different dp is not supported)");
    out.push_back(std::move(mesh));
  }
  std::vector<int> etps;
  CKPT_RETURN_IF_ERROR(flagscale_ints(j, "expert_tensor_parallel_size_per_process_mesh", etps, false));
  if (!etps.empty() && etps.size() != out.size())
    return bad_flagscale("FlagScale layout: 'expert_tensor_parallel_size_per_process_mesh' has " + std::to_string(etps.size()) +
                         " entries for " + std::to_string(out.size()) + " process meshes");
  int etp = 0;
  if (auto it = j.find("expert_tensor_parallel_size"); it != j.end() && !it->is_null()) {  // None in FlagScale: = tp
    if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > kFlagScaleMax)
      return bad_flagscale("FlagScale layout key 'expert_tensor_parallel_size' must be an integer in 1.." +
                           std::to_string(kFlagScaleMax) + ", got " + it->dump());
    etp = static_cast<int>(it->get<int64_t>());
  }
  for (size_t m = 0; m < out.size(); ++m) out[m].etp = etps.empty() ? etp : etps[m];
  return out;
}

// Per-pipeline micro-batch sizes (size dp), from micro_batch_size or hetero_micro_batch_sizes.
Result<std::vector<int>> flagscale_micro_batches(const nlohmann::json& j, int dp) {
  std::vector<int> mbs(static_cast<size_t>(dp), 1);
  if (auto it = j.find("micro_batch_size"); it != j.end()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > kFlagScaleMax)
      return bad_flagscale("FlagScale layout key 'micro_batch_size' must be an integer in 1.." + std::to_string(kFlagScaleMax) +
                 ", got " + it->dump());
    mbs.assign(mbs.size(), static_cast<int>(it->get<int64_t>()));
  }
  std::vector<int> pairs;
  CKPT_RETURN_IF_ERROR(flagscale_ints(j, "hetero_micro_batch_sizes", pairs, false));
  if (pairs.empty()) return mbs;
  if (j.contains("micro_batch_size"))
    return bad_flagscale("FlagScale layout: 'hetero_micro_batch_sizes' replaces 'micro_batch_size'; give one of them");
  if (pairs.size() % 2 != 0)
    return bad_flagscale("FlagScale layout key 'hetero_micro_batch_sizes' must be pairs [n0, mbs0, n1, mbs1, ...], got " +
               std::to_string(pairs.size()) + " entries");
  mbs.clear();
  for (size_t i = 0; i < pairs.size(); i += 2) {
    if (static_cast<int64_t>(mbs.size()) + pairs[i] > dp) break;
    mbs.insert(mbs.end(), static_cast<size_t>(pairs[i]), pairs[i + 1]);
  }
  int64_t n = 0;
  for (size_t i = 0; i < pairs.size(); i += 2) n += pairs[i];
  if (n != dp)
    return bad_flagscale("FlagScale layout: the data-parallel counts of 'hetero_micro_batch_sizes' sum to " + std::to_string(n) +
               ", the meshes' dp is " + std::to_string(dp));
  return mbs;
}

Status flagscale_flags(const nlohmann::json& j) {
  if (auto it = j.find("enable_hetero"); it != j.end() && *it != true)
    return bad_flagscale("FlagScale layout: 'enable_hetero' must be true when given, got " + it->dump());
  if (auto it = j.find("standalone_embedding_stage"); it != j.end() && *it != false)
    return Status::Unsupported("FlagScale layout: standalone_embedding_stage is not supported (FlagScale refuses it "
                               "with process meshes too)");
  if (auto it = j.find("hetero_use_cpu_communication"); it != j.end() && !it->is_boolean())
    return bad_flagscale("FlagScale layout key 'hetero_use_cpu_communication' must be a boolean");
  if (auto it = j.find("use_distributed_optimizer"); it != j.end() && !it->is_boolean())
    return bad_flagscale("FlagScale layout key 'use_distributed_optimizer' must be a boolean");
  return Status::Ok();
}

}  // namespace

Result<Layout> layout_from_flagscale(const nlohmann::json& j) {
  CKPT_RETURN_IF_ERROR(flagscale_keys(j));
  CKPT_RETURN_IF_ERROR(flagscale_flags(j));
  CKPT_ASSIGN_OR_RETURN(std::vector<FlagScaleMesh> meshes, flagscale_meshes(j));
  if (auto it = j.find("hetero_current_device_type"); it != j.end()) {
    bool found = false;
    for (const FlagScaleMesh& m : meshes) found = found || (it->is_string() && m.device == it->get<std::string>());
    if (!found) return bad_flagscale("FlagScale layout: hetero_current_device_type " + it->dump() + " is none of hetero_device_types");
  }
  int stages = 0;
  for (const FlagScaleMesh& m : meshes) stages += m.pp;
  std::vector<int> split;
  CKPT_RETURN_IF_ERROR(flagscale_ints(j, "hetero_pipeline_layer_split", split, false));
  if (split.empty()) {  // FlagScale's default: num_layers // stages on every stage
    auto nl = j.find("num_layers");
    if (nl == j.end() || !nl->is_number_integer() || nl->get<int64_t>() < stages || nl->get<int64_t>() > kFlagScaleMax)
      return bad_flagscale("FlagScale layout needs 'hetero_pipeline_layer_split' (layers of each of the " +
                 std::to_string(stages) + " stages) or 'num_layers' (an even split)");
    if (nl->get<int64_t>() % stages != 0)
      return bad_flagscale("FlagScale layout: num_layers " + nl->dump() + " is not a multiple of the " + std::to_string(stages) +
                 " stages; give 'hetero_pipeline_layer_split'");
    split.assign(static_cast<size_t>(stages), static_cast<int>(nl->get<int64_t>() / stages));
  }
  if (static_cast<int>(split.size()) != stages)
    return bad_flagscale("FlagScale layout: 'hetero_pipeline_layer_split' has " + std::to_string(split.size()) +
               " stages, the meshes' pp sum to " + std::to_string(stages));
  CKPT_ASSIGN_OR_RETURN(std::vector<int> mbs, flagscale_micro_batches(j, meshes[0].dp));
  std::vector<PipelineSpec> pls(static_cast<size_t>(meshes[0].dp));
  for (size_t p = 0; p < pls.size(); ++p) {
    pls[p].micro_batch = mbs[p];
    size_t s = 0;
    for (const FlagScaleMesh& m : meshes)
      for (int k = 0; k < m.pp; ++k, ++s) pls[p].stages.push_back({split[s], m.tp, m.device, m.ep, m.etp});
  }
  int64_t vd = 128;
  if (auto it = j.find("make_vocab_size_divisible_by"); it != j.end()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > std::numeric_limits<int>::max())
      return bad_flagscale("FlagScale layout key 'make_vocab_size_divisible_by' must be a positive integer, got " + it->dump());
    vd = it->get<int64_t>();
  }
  std::string profile = "reference";
  if (auto it = j.find("profile"); it != j.end()) {
    if (!it->is_string()) return bad_flagscale("FlagScale layout key 'profile' must be a string");
    profile = it->get<std::string>();
  }
  const int zero = j.value("use_distributed_optimizer", false) ? 1 : 0;
  CKPT_ASSIGN_OR_RETURN(Layout l, Layout::from_pipelines(std::move(pls), zero, vd, profile));
  if (auto nl = j.find("num_layers"); nl != j.end() && (!nl->is_number_integer() || nl->get<int64_t>() != l.num_layers()))
    return bad_flagscale("FlagScale layout: num_layers " + nl->dump() + " but hetero_pipeline_layer_split sums to " +
               std::to_string(l.num_layers()));
  return l;
}

}  // namespace ckpt
