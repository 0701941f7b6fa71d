// The bucket layout of Megatron-Core's distributed optimizer (megatron/core/optimizer/
// param_layout.py and DistributedOptimizer._compute_per_buffer_param_layout, 0.17 .. 0.19): where
// each parameter's fp32 master and moments sit in a grad buffer's flat buckets, derived from the
// parameter list and the settings the args record, never guessed. One named error per rule.
//
// Layout rules (one grad buffer = one model chunk's parameters of one dtype):
//  R1 order:     parameters in REVERSE registration order (backprop order).
//  R2 align:     each parameter starts at a multiple of 64 elements (pad_param_start).
//  R3 split:     a bucket closes after the parameter whose end - bucket start >= bucket_size (when
//                a bucket size applies), and around a `shared_embedding` parameter (tied
//                embedding/output on pp > 1): it opens a new bucket when the current one holds
//                parameters and closes its own.
//  R4 pad:       a bucket's end is padded to a multiple of lcm(dp, 128) (lcm(dp, 128, 65536) with
//                pad_buckets_for_high_nccl_busbw); the next bucket starts there.
//  R5 unpadded:  numel_unpadded = the last parameter's end - the bucket's start.
// Settings rules (Megatron-LM args; distributed_data_parallel.py, training.get_model):
//  S1 dp:          data_parallel_size * context_parallel_size (else world_size / (tp * pp));
//                  neither recorded: BadDistOptimArgs.
//  S2 bucket size: ddp_bucket_size, else max(40000000, 1000000 * dp); none (one bucket) when
//                  overlap_grad_reduce is false, on pipeline stages after the first, for model
//                  chunks after the first and with overlap_param_gather_with_optimizer_step.
//  S3 instances:   num_distributed_optimizer_instances > 1 (dp split in instances): UnsupportedDistOptim.
// Checks against what the checkpoint records (dp_reshardable: each bucket tensor's global size is
// that bucket's numel_unpadded):
//  C1 count:  as many recorded buckets as derived: DistOptimBucketCount.
//  C2 buffer: a recorded size past the derived padded bucket: DistOptimPastBuffer.
//  C3 sizes:  each recorded size equal to the derived numel_unpadded: DistOptimBucketMismatch.
// States rule (DistributedOptimizer.optimizer_state_keys):
//  M1 moments: args.optimizer 'lion' keeps exp_avg only; every other optimizer (or none recorded)
//              exp_avg and exp_avg_sq. A moment it keeps missing from the saved state:
//              MissingDistOptimState (never imported as a one-moment state).
// Pure functions; thread safe.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/base/status.h"

namespace ckpt {

struct DistOptimParam {
  std::string name;
  int64_t numel = 0;
  bool shared_embedding = false;
};

struct DistOptimSlot {
  std::string name;
  size_t bucket = 0;
  int64_t start = 0, end = 0;  // in the grad buffer (padded coordinates)
};

struct DistOptimBucket {
  int64_t start = 0, end = 0;  // in the grad buffer; end padded (R4)
  int64_t numel_unpadded = 0;  // R5
};

struct DistOptimLayout {
  std::vector<DistOptimSlot> params;  // buffer order (R1)
  std::vector<DistOptimBucket> buckets;
};

struct DistOptimSettings {
  int64_t dp = 1;
  std::optional<int64_t> bucket_size;  // none: one bucket
  bool pad_for_high_nccl_busbw = false;
};

// R1..R5. `params` in registration order; numel >= 1, dp >= 1, bucket size >= 1, else
// BadDistOptimArgs.
Result<DistOptimLayout> dist_optim_layout(const std::vector<DistOptimParam>& params, const DistOptimSettings& s);

// S1..S3 for the chunk `chunk` of pipeline stage `pp_rank`; `file` names the args' origin.
Result<DistOptimSettings> dist_optim_settings(const nlohmann::json& args, int pp_rank, int chunk,
                                              const std::string& file);

// C1..C3: `recorded` = each bucket's recorded numel_unpadded; `where` names the buffer.
Status check_dist_optim_buckets(const DistOptimLayout& layout, const std::vector<int64_t>& recorded,
                                const std::string& where);

// M1: the moments args.optimizer keeps; `has(state)` says whether the saved state holds one;
// `where` names the state in the message, `file` is the file (or directory) it is in.
Status check_dist_optim_moments(const nlohmann::json& args, const std::function<bool(const std::string&)>& has,
                                const std::string& where, const std::string& file);

}  // namespace ckpt
