// dp_zero_gather_scatter (converters/megatron/dist/megatron_dist_optim.h plan_dp_zero).
#include <algorithm>
#include <filesystem>
#include <map>

#include "converters/megatron/dist/megatron_dist_optim.h"
#include "converters/megatron/megatron_distrib_optim.h"
#include "converters/megatron/megatron_vpp.h"

namespace ckpt {

namespace dist_optim_zero_detail {

namespace fs = std::filesystem;

Status bad_state(const std::string& where, const std::string& why) {
  return Status::Error("BadDistOptimState", where + ": " + why).with_file(where);
}

// The item `fqn` opened as a torch.save zip, after checking it lies inside its file.
Result<std::shared_ptr<torch::TorchFile>> open_item(const std::string& dir, const torch::DcpBytesItem& item) {
  CKPT_RETURN_IF_ERROR(torch::check_dcp_relative_path(item.file, item.fqn));
  const std::string path = (fs::path(dir) / item.file).string();
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec || item.length == 0 || item.offset > size || item.length > size - item.offset)
    return bad_state(path, "item '" + item.fqn + "' lies outside its file");
  torch::TorchFileLimits lim;
  lim.max_pickle_bytes = uint64_t{64} << 20;
  CKPT_ASSIGN_OR_RETURN(auto tf, torch::TorchFile::open(path, item.offset, item.length, lim));
  return std::shared_ptr<torch::TorchFile>(std::move(tf));
}

// {state: world tensor} and numel_unpadded of grad buffer `gbuf` of `root` ([state dict]; `gbufs`
// buffers, one per model chunk).
Status world_tensors(const torch::PyObj* root, const std::string& where, std::map<std::string, torch::TensorRef>& out,
                     int64_t& numel, int gbuf, int gbufs) {
  const torch::PyObj* d = root && (root->is(torch::PyType::kList) || root->is(torch::PyType::kTuple)) && root->items.size() == 1
                              ? root->items[0]
                              : nullptr;
  if (!d) return bad_state(where, "not a torch.save of [dict]");
  return megatron_world_buffers(d, where, out, numel, gbuf, gbufs);
}

// Grad buffer `chunk` of model-parallel group (tp_r, pp_r), from its param_state item `tf`: the world
// buffers, checked against the layout of its chunk stage (`stages`: the plain pipeline of chunk stages).
Status plan_zero_chunk(const std::shared_ptr<torch::TorchFile>& tf, const LlamaConfig& cfg, const Layout& stages, int vpp,
                       const nlohmann::json& args, const std::string& dir, const std::string& where_in, int tp_r, int pp_r,
                       int chunk, std::set<std::pair<std::string, Shape>>& seen, DistOptimPlan& plan) {
  const std::string where = vpp > 1 ? where_in + " (grad buffer " + std::to_string(chunk) + ")" : where_in;
  std::map<std::string, torch::TensorRef> world;
  int64_t numel = -1;
  CKPT_RETURN_IF_ERROR(world_tensors(tf->root(), where, world, numel, chunk, vpp));
  if (!world.count("param")) return Status::Error("MissingDistOptimState", where + ": no masters 'param'").with_file(dir);
  CKPT_RETURN_IF_ERROR(check_dist_optim_moments(args, [&](const std::string& m) { return world.count(m) > 0; }, where, dir));
  std::vector<std::string> states;
  for (const auto& [k, t] : world) states.push_back(k);
  if (plan.states.empty()) plan.states = states;
  if (plan.states != states) return Status::Error("MissingDistOptimState", where + ": other states than dp_group_idx_0's").with_file(dir);
  for (const auto& k : states)
    if (k != "param" && k != "exp_avg" && k != "exp_avg_sq")
      return Status::Error("UnsupportedDistOptim", where + ": state '" + k + "' is not read").with_file(dir);
  const int pp = stages.pp / vpp;
  CKPT_ASSIGN_OR_RETURN(DistOptimGroup grp, dist_optim_group(cfg, stages, args, dir, tp_r, chunk * pp + pp_r, vpp));
  std::vector<int64_t> before;  // world offset of each bucket: the earlier buckets unpadded
  int64_t total = 0;
  for (const auto& b : grp.layout.buckets) before.push_back(total), total += b.numel_unpadded;
  if (total != numel)
    return Status::Error("DistOptimBucketMismatch", where + ": numel_unpadded " + std::to_string(numel) +
                                                        ", the parameters and args give " + std::to_string(total) +
                                                        ": the sizes do not add up")
        .with_file(dir);
  std::map<std::string, int> world_index;
  for (const auto& [k, t] : world) world_index[k] = static_cast<int>(plan.worlds.size()), plan.worlds.push_back({tf, t});
  auto at = [&](size_t k, const std::string& state, int64_t flat, int64_t) -> std::optional<DistOptimPiece> {
    DistOptimPiece piece;
    piece.world = world_index.at(state);
    piece.flat = before[grp.layout.params[k].bucket] + flat;
    return piece;
  };
  add_group_pieces(grp, plan.states, at, seen, plan);
  return Status::Ok();
}

}  // namespace dist_optim_zero_detail

Result<std::optional<DistOptimPlan>> plan_dp_zero(const torch::DcpMetadata& md, const LlamaConfig& cfg,
                                                  const Layout& saved, int64_t vpp, const nlohmann::json& args,
                                                  const std::string& dir) {
  using namespace dist_optim_zero_detail;
  std::map<int64_t, const torch::DcpBytesItem*> items;
  const std::string pre = kDistOptimBucketPrefix;
  for (const auto& b : md.bytes) {
    const size_t e = b.fqn.find(".param_state/");
    if (b.fqn.rfind(pre, 0) != 0 || e == std::string::npos || e <= pre.size() || e - pre.size() > 9) continue;
    const std::string g = b.fqn.substr(pre.size(), e - pre.size());
    if (g.find_first_not_of("0123456789") == std::string::npos) items[std::stoll(g)] = &b;
  }
  if (items.empty()) return std::optional<DistOptimPlan>();
  DistOptimPlan plan;
  if (args.value("transformer_impl", std::string()) != "local")
    plan.not_imported_reason = "only the local spec's parameter order (transformer_impl 'local') is known";
  if (!plan.not_imported_reason.empty()) return std::optional<DistOptimPlan>(std::move(plan));
  // A virtual pipeline: one grad buffer per model chunk in each param_state (keys 0 .. v-1), chunk c over
  // its chunk stage of the plain pipeline (megatron_vpp.h), as dp_reshardable's buckets.
  const int v = static_cast<int>(std::max<int64_t>(1, vpp));
  Layout stages = saved;
  if (v > 1) {
    CKPT_ASSIGN_OR_RETURN(stages, megatron_vpp_layout(saved, v, "'" + dir + "'"));
  }
  std::set<std::pair<std::string, Shape>> seen;
  for (int p = 0; p < saved.pp; ++p)
    for (int r = 0; r < saved.tp; ++r) {
      const int64_t g = r + int64_t{saved.tp} * p;
      const std::string where = "'" + dir + "' dp_group_idx_" + std::to_string(g) + ".param_state";
      if (!items.count(g))
        return Status::Error("MissingDistOptimState", where + ": no such item").with_file(dir);
      CKPT_ASSIGN_OR_RETURN(auto tf, open_item(dir, *items[g]));
      for (int c = 0; c < v; ++c) CKPT_RETURN_IF_ERROR(plan_zero_chunk(tf, cfg, stages, v, args, dir, where, r, p, c, seen, plan));
      plan.items_read.insert(items[g]->fqn);
    }
  return std::optional<DistOptimPlan>(std::move(plan));
}

}  // namespace ckpt
