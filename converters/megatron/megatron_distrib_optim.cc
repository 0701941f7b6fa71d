#include "converters/megatron/megatron_distrib_optim.h"

#include "converters/megatron/dist_optim_layout.h"

namespace ckpt {

namespace {

Status bad_state(const std::string& where, const std::string& why) {
  return Status::Error("BadDistOptimState", where + ": " + why).with_file(where);
}

}  // namespace

Status megatron_world_buffers(const torch::PyObj* d, const std::string& where,
                              std::map<std::string, torch::TensorRef>& out, int64_t& numel, int gbuf_index, int gbufs) {
  if (!d || !d->is(torch::PyType::kDict)) return bad_state(where, "not a dict");
  const torch::PyObj* coalesced = d->get("buckets_coalesced");
  if (!coalesced || !coalesced->is(torch::PyType::kBool) || !coalesced->b)
    return Status::Error("UnsupportedDistOptim", where + ": not buckets_coalesced (the pre-2024 layout needs Megatron's own update)")
        .with_file(where);
  const torch::PyObj* gbuf = nullptr;
  int seen = 0;
  for (const auto& [k, v] : d->entries) {
    if (k->is(torch::PyType::kStr)) continue;
    if (!k->is(torch::PyType::kInt) || k->i < 0 || k->i >= gbufs)
      return Status::Error("UnsupportedDistOptim", where + ": grad buffer key " + (k->is(torch::PyType::kInt) ? std::to_string(k->i) : "?") +
                                                       ", expected " + std::to_string(gbufs) + " grad buffer(s) 0 .. " +
                                                       std::to_string(gbufs - 1) + " (one per model chunk, one dtype)")
          .with_file(where);
    ++seen;
    if (k->i == gbuf_index) gbuf = v;
  }
  if (seen != gbufs)
    return Status::Error("UnsupportedDistOptim", where + ": " + std::to_string(seen) + " grad buffer(s), expected " +
                                                     std::to_string(gbufs) + " (one per model chunk)").with_file(where);
  if (!gbuf || !gbuf->is(torch::PyType::kDict) || gbuf->entries.size() != 1 || !gbuf->entries[0].second->is(torch::PyType::kDict))
    return bad_state(where, "no grad buffer " + std::to_string(gbuf_index) + " with one dtype");
  for (const auto& [k, v] : gbuf->entries[0].second->entries) {
    if (!k->is(torch::PyType::kStr)) return bad_state(where, "a state key that is not a string");
    if (k->s == "numel_unpadded" && v->is(torch::PyType::kInt)) numel = v->i;
    else if (v->is(torch::PyType::kTensor) && v->tensor.size.size() == 1 && v->tensor.stride == std::vector<int64_t>{1})
      out[k->s] = v->tensor;
    else return bad_state(where, "state '" + k->s + "' is not a 1-D tensor");
  }
  if (numel < 0) return bad_state(where, "no numel_unpadded");
  for (const auto& [k, t] : out)
    if (t.size[0] != numel)
      return Status::Error("DistOptimBucketMismatch", where + ": '" + k + "' holds " + std::to_string(t.size[0]) +
                                                          " elements, numel_unpadded is " + std::to_string(numel))
          .with_file(where);
  return Status::Ok();
}

namespace {

// Chunk `chunk`'s grad buffer `world` (numel_unpadded `numel`) laid out over `params`: views per
// parameter and state appended to `out`.
Status chunk_views(MegatronDistribOptim& out, const std::map<std::string, torch::TensorRef>& world, int64_t numel,
                   const std::vector<MegatronModelParam>& params, const nlohmann::json& args, int pp_rank, int chunk,
                   const std::string& where) {
  std::vector<DistOptimParam> ps;
  for (const auto& p : params) {
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    ps.push_back({p.name, n, false});  // shared_embedding: tied embeddings on pp > 1 are refused by the caller
  }
  CKPT_ASSIGN_OR_RETURN(DistOptimSettings s, dist_optim_settings(args, pp_rank, chunk, where));
  CKPT_ASSIGN_OR_RETURN(DistOptimLayout lay, dist_optim_layout(ps, s));
  std::vector<int64_t> before;
  int64_t total = 0;
  for (const auto& b : lay.buckets) before.push_back(total), total += b.numel_unpadded;
  if (total != numel)
    return Status::Error("DistOptimBucketMismatch", "'" + where + "': grad buffer " + std::to_string(chunk) + ": numel_unpadded " +
                                                        std::to_string(numel) + ", the parameters and args give " +
                                                        std::to_string(total) + ": the sizes do not add up")
        .with_file(where);
  static const std::map<std::string, const char*> kPrefix = {
      {"exp_avg", kMegatronOptimPrefixes[0]}, {"exp_avg_sq", kMegatronOptimPrefixes[1]}, {"param", kMegatronOptimPrefixes[2]}};
  for (size_t k = 0; k < lay.params.size(); ++k) {
    const MegatronModelParam& p = params[params.size() - 1 - k];  // R1: buffer order is reversed
    const int64_t off = before[lay.params[k].bucket] + lay.params[k].start - lay.buckets[lay.params[k].bucket].start;
    for (const auto& [state, w] : world) {
      if (state == "param" && p.dtype == DType::kF32) continue;  // an fp32 parameter is its own master
      torch::TensorRef v = w;
      v.storage_offset = w.storage_offset + off;
      v.size.assign(p.shape.begin(), p.shape.end());
      v.stride.assign(p.shape.size(), 1);
      for (size_t d = p.shape.size(); d-- > 1;) v.stride[d - 1] = v.stride[d] * p.shape[d];
      out.views.push_back(std::move(v));
      out.tensors.push_back({kPrefix.at(state) + p.name, &out.views.back()});
      out.chunk_of.push_back(chunk);
    }
  }
  return Status::Ok();
}

}  // namespace

Result<MegatronDistribOptim> megatron_distrib_optim(const std::string& path,
                                                    const std::vector<std::vector<MegatronModelParam>>& params,
                                                    const nlohmann::json& args, int pp_rank) {
  MegatronDistribOptim out;
  CKPT_ASSIGN_OR_RETURN(out.file, torch::TorchFile::open(path));
  const bool tied = !(args.contains("untie_embeddings_and_output_weights") && args["untie_embeddings_and_output_weights"] == true);
  if (tied && args.value("pipeline_model_parallel_size", 1) > 1)
    return Status::Error("UnsupportedDistOptim", "'" + path + "': tied embeddings on several pipeline stages").with_file(path);
  const int chunks = static_cast<int>(params.size());
  for (int c = 0; c < chunks; ++c) {
    std::map<std::string, torch::TensorRef> world;
    int64_t numel = -1;
    const std::string where = "'" + path + "'" + (chunks > 1 ? " (grad buffer " + std::to_string(c) + ": model" + std::to_string(c) + ")" : "");
    CKPT_RETURN_IF_ERROR(megatron_world_buffers(out.file->root(), path, world, numel, c, chunks));
    if (!world.count("param"))
      return Status::Error("MissingDistOptimState", where + " has no 'param' world buffer").with_file(path);
    CKPT_RETURN_IF_ERROR(check_dist_optim_moments(args, [&](const std::string& m) { return world.count(m) > 0; }, where, path));
    for (const auto& [k, t] : world)
      if (k != "param" && k != "exp_avg" && k != "exp_avg_sq")
        return Status::Error("UnsupportedDistOptim", where + ": state '" + k + "' is not read").with_file(path);
    CKPT_RETURN_IF_ERROR(chunk_views(out, world, numel, params[static_cast<size_t>(c)], args, pp_rank, c, path));
  }
  return out;
}

}  // namespace ckpt
