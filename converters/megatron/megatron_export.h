// export_megatron: a checkpoint's model weights (any source in global view) as Megatron-LM
// per-rank safetensors files (mcore GPT, LLaMA settings): the plan (layout, segment map, checks of
// every needed tensor) and its run through the reshard engine into a MegatronSink.
// Thread safety: reentrant.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "converters/megatron/megatron_dist_opt_export.h"
#include "converters/megatron/megatron_segments.h"
#include "formats/tensor/tensor_io.h"

namespace ckpt {

class WritePool;

enum class MegatronFileFormat {
  kSafetensors,  // mp_rank_XX[_YYY]/model.safetensors + megatron_args.json (ckpt's own)
  kTorch,        // Megatron-LM's legacy latest_checkpointed_iteration.txt + iter_N/mp_rank_*/model_optim_rng.pt
};

struct MegatronExportOptions {
  MegatronFileFormat format = MegatronFileFormat::kSafetensors;
  int64_t iteration = 0;  // kTorch: the iteration the files are saved as
  int tp = 1, pp = 1;
  // MoE (docs/MOE.md step 3): expert parallel size and expert TP size (0: tp, Megatron's default);
  // rank files mp_rank_TT[_PPP]_EEE when ep > 1.
  int ep = 1, etp = 0;
  std::vector<int> layers_per_stage;  // empty: even split, earlier stages take the remainder
  // Virtual pipeline (kTorch and torch_dist): vpp interleaved chunks per stage, chunk c of stage p
  // holding Megatron's interleaved layers (converters/megatron/megatron_vpp.h); 1 = none. Needs
  // num_layers % (pp * vpp) == 0 and an even split (else MegatronVppLayersNotDivisible);
  // kSafetensors refuses it (MegatronVppFormat), kTorch a source with optimizer state without --dist-opt (MegatronVppOptimizer;
  // with --dist-opt distrib_optim.pt holds one grad buffer per chunk).
  int vpp = 1;
  int64_t vocab_divisor = 128;        // make-vocab-size-divisible-by
  std::optional<DType> dtype;         // output dtype; default: each canonical tensor's own
  MegatronNormNames norms = MegatronNormNames::kTransformerEngine;
  // --dist-opt: the optimizer state as Megatron's distributed optimizer (kTorch: distrib_optim.pt
  // beside each rank file; torch_dist: dp_reshardable buckets), laid out for dp and the bucket size.
  MegatronDistOptOptions dist_opt;
  // torch_dist: the megatron-core version whose layout is written, "0.16" .. "0.19" (0.19: the
  // common state as the DCP item common_state; older: common.pt).
  std::string megatron_version = "0.19";
  uint64_t chunk_bytes = 16ull << 20;  // engine chunk (output bytes per sink write)
  // The torch and torch_dist files' direct writes staged there, several large requests in flight
  // (formats/io/write_pool.h; the job's); not owned. Null: each file as its size resolves --io auto.
  WritePool* write_pool = nullptr;
  // Called after each chunk is written: (output bytes done, total), padding rows not counted.
  std::function<void(uint64_t, uint64_t)> progress;
  // Called after every byte is written, before the commit (the job's check of its SRC,
  // converters/source/source_check_job.h): an error leaves nothing at the destination.
  std::function<Status()> before_commit;
};

// Writes `dst`/mp_rank_XX[_YYY]/model.safetensors for every rank plus `dst`/megatron_args.json
// (kTorch: the legacy torch layout of converters/megatron/megatron_torch_export.h, staged through those
// files in `dst`.staging, removed afterwards),
// from the model tensors of `src` (global view; config from metadata "model_config"). Output goes
// to `dst`.partial, renamed to `dst` when complete; `dst` must not exist. kTorch: the source's
// optimizer.exp_avg / exp_avg_sq (/ fp32_param) tensors, when it has them, are written as the
// rank files' 'optimizer' entry (converters/megatron/megatron_torch_export.h); kSafetensors writes weights
// only. With opts.dist_opt (kTorch only): no per-parameter 'optimizer' state; instead each rank's
// world buffers (converters/megatron/megatron_dist_opt_export.h) become distrib_optim.pt beside its
// model_optim_rng.pt and 'optimizer' holds DistributedOptimizer.state_dict()'s param groups; the args
// record dp and the bucket size. Every needed tensor is checked (present, shape) before anything is
// written.
Status export_megatron(TensorSource& src, const std::string& dst, const MegatronExportOptions& opts);

}  // namespace ckpt
