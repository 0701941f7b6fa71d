#include "converters/megatron/dist_optim_layout.h"

#include <algorithm>
#include <numeric>

namespace ckpt {

namespace {

int64_t pad_to(int64_t v, int64_t d) { return (v + d - 1) / d * d; }

std::optional<int64_t> int_arg(const nlohmann::json& args, const char* key) {
  if (args.contains(key) && args[key].is_number_integer()) return args[key].get<int64_t>();
  return std::nullopt;
}

bool bool_arg(const nlohmann::json& args, const char* key) {
  return args.contains(key) && args[key].is_boolean() && args[key].get<bool>();
}

}  // namespace

Result<DistOptimLayout> dist_optim_layout(const std::vector<DistOptimParam>& params, const DistOptimSettings& s) {
  if (s.dp < 1 || s.dp > (int64_t{1} << 24) || (s.bucket_size && *s.bucket_size < 1))
    return Status::Error("BadDistOptimArgs", "distributed optimizer layout: dp " + std::to_string(s.dp) +
                                                 " and bucket size must be >= 1");
  const int64_t divisor = s.pad_for_high_nccl_busbw ? std::lcm(std::lcm(s.dp, int64_t{128}), int64_t{65536})
                                                    : std::lcm(s.dp, int64_t{128});  // R4
  DistOptimLayout out;
  int64_t start = 0, bucket_start = 0, end = 0;
  size_t in_bucket = 0;
  auto finalize = [&](int64_t param_end) {  // R4, R5
    out.buckets.push_back(DistOptimBucket{bucket_start, pad_to(param_end, divisor), param_end - bucket_start});
    bucket_start = out.buckets.back().end;
    in_bucket = 0;
  };
  for (auto it = params.rbegin(); it != params.rend(); ++it) {  // R1
    if (it->numel < 1 || it->numel > (int64_t{1} << 50))
      return Status::Error("BadDistOptimArgs", "distributed optimizer layout: parameter '" + it->name +
                                                   "' has " + std::to_string(it->numel) + " elements");
    start = pad_to(start, 64);  // R2
    if (it->shared_embedding && in_bucket > 0) {  // R3
      finalize(start);
      start = bucket_start;
    }
    end = start + it->numel;
    out.params.push_back(DistOptimSlot{it->name, out.buckets.size(), start, end});
    ++in_bucket;
    if ((s.bucket_size && end - bucket_start >= *s.bucket_size) || it->shared_embedding) {  // R3
      finalize(end);
      start = bucket_start;
    } else {
      start = end;
    }
  }
  if (in_bucket > 0) finalize(end);
  return out;
}

Result<DistOptimSettings> dist_optim_settings(const nlohmann::json& args, int pp_rank, int chunk,
                                              const std::string& file) {
  auto bad = [&](const std::string& why) {
    return Status::Error("BadDistOptimArgs", "'" + file + "': the distributed optimizer's bucket layout: " + why)
        .with_file(file);
  };
  if (int_arg(args, "num_distributed_optimizer_instances").value_or(1) != 1)  // S3
    return Status::Error("UnsupportedDistOptim", "'" + file +
                                                     "': num_distributed_optimizer_instances > 1 (the data-parallel "
                                                     "group split in optimizer instances) is not read")
        .with_file(file);
  DistOptimSettings s;
  const int64_t cp = int_arg(args, "context_parallel_size").value_or(1);
  if (auto dp = int_arg(args, "data_parallel_size")) {  // S1
    s.dp = *dp * cp;
  } else {
    auto world = int_arg(args, "world_size");
    const int64_t tp = int_arg(args, "tensor_model_parallel_size").value_or(1);
    const int64_t pp = int_arg(args, "pipeline_model_parallel_size").value_or(1);
    if (!world || tp < 1 || pp < 1 || *world % (tp * pp) != 0)
      return bad("args record neither data_parallel_size nor a world_size divisible by tp * pp");
    s.dp = *world / (tp * pp);
  }
  if (s.dp < 1 || cp < 1) return bad("data-parallel size " + std::to_string(s.dp) + " < 1");
  s.pad_for_high_nccl_busbw = bool_arg(args, "ddp_pad_buckets_for_high_nccl_busbw") ||
                              bool_arg(args, "pad_buckets_for_high_nccl_busbw");
  const bool one_bucket = !bool_arg(args, "overlap_grad_reduce") || pp_rank > 0 || chunk > 0 ||
                          bool_arg(args, "overlap_param_gather_with_optimizer_step");  // S2
  if (!one_bucket) {
    if (args.contains("ddp_bucket_size") && !args["ddp_bucket_size"].is_null()) {
      auto b = int_arg(args, "ddp_bucket_size");
      if (!b || *b < 1) return bad("ddp_bucket_size is not a positive integer");
      s.bucket_size = *b;
    } else {
      s.bucket_size = std::max<int64_t>(40000000, 1000000 * s.dp);
    }
  }
  return s;
}

Status check_dist_optim_buckets(const DistOptimLayout& layout, const std::vector<int64_t>& recorded,
                                const std::string& where) {
  if (recorded.size() != layout.buckets.size())  // C1
    return Status::Error("DistOptimBucketCount", where + ": the checkpoint records " + std::to_string(recorded.size()) +
                                                     " buckets, the parameters and args give " +
                                                     std::to_string(layout.buckets.size()));
  for (size_t b = 0; b < recorded.size(); ++b) {
    const DistOptimBucket& d = layout.buckets[b];
    if (recorded[b] > d.end - d.start)  // C2
      return Status::Error("DistOptimPastBuffer", where + ": bucket " + std::to_string(b) + " records " +
                                                      std::to_string(recorded[b]) + " elements, past its buffer of " +
                                                      std::to_string(d.end - d.start));
    if (recorded[b] != d.numel_unpadded)  // C3
      return Status::Error("DistOptimBucketMismatch",
                           where + ": bucket " + std::to_string(b) + " records " + std::to_string(recorded[b]) +
                               " elements (numel_unpadded), the parameters and args give " +
                               std::to_string(d.numel_unpadded) + ": the sizes do not add up");
  }
  return Status::Ok();
}

Status check_dist_optim_moments(const nlohmann::json& args, const std::function<bool(const std::string&)>& has,
                                const std::string& where, const std::string& file) {
  const std::string optim = args.contains("optimizer") && args["optimizer"].is_string() ? args["optimizer"].get<std::string>() : "adam";
  const std::vector<std::string> moments =
      optim == "lion" ? std::vector<std::string>{"exp_avg"} : std::vector<std::string>{"exp_avg", "exp_avg_sq"};
  for (const std::string& m : moments)
    if (!has(m))
      return Status::Error("MissingDistOptimState", where + ": no '" + m + "' state, which args.optimizer '" + optim +
                                                        "' keeps (megatron-core's optimizer_state_keys: " +
                                                        (moments.size() == 1 ? "exp_avg" : "exp_avg, exp_avg_sq") + ")")
          .with_file(file);
  return Status::Ok();
}

}  // namespace ckpt
