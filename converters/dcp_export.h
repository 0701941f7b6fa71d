// Export of a checkpoint's model weights to a torchtitan-style PyTorch Distributed Checkpoint
// (formats/torch/dcp_writer.h): the tensors and names of the HuggingFace export (plan_hf_export:
// canonical names ARE HF names, optimizer state and rotary inv_freq left out, optional cast), one
// DCP chunk per tensor, the tensors spread over `files` writer ranks (__<r>_0.distcp, balanced by
// bytes), streamed through the reshard Executor within its chunk budget. The result loads with
// torch.distributed.checkpoint.load into a transformers model's state_dict.
// Thread safety: reentrant.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "converters/hf_export.h"
#include "formats/tensor_io.h"

namespace ckpt {

struct DcpExportOptions {
  std::optional<DType> dtype;  // cast float tensors to this; nullopt keeps each tensor's dtype
  int files = 1;               // writer ranks (.distcp files)
  int threads = 2;
  uint64_t max_chunk_bytes = 64ull << 20;
  bool fsync = true;
  std::function<void(uint64_t, uint64_t)> progress;
};

// The tensors to write (plan_hf_export's, without tokenizer / config files).
Result<HfExportPlan> plan_dcp_export(const TensorSource& src, const std::string& src_path, const DcpExportOptions& opts);

// Writes `out` (a new directory, committed by renaming `<out>.partial`); nothing is left at `out`
// on failure.
Status run_dcp_export(TensorSource& src, const HfExportPlan& plan, const std::string& out, const DcpExportOptions& opts);

}  // namespace ckpt
