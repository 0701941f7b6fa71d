// Export of a checkpoint's model weights to a torchtitan-style PyTorch Distributed Checkpoint
// (formats/torch/dcp/dcp_writer.h): the tensors and names of the HuggingFace export (plan_hf_export:
// canonical names ARE HF names, optimizer state and rotary inv_freq left out, optional cast), one
// DCP chunk per tensor, or with `source_chunks` one per distinct box of the source's pieces (a
// tp=2 checkpoint gives two chunks per split tensor; replicas count once; a tensor whose source
// boxes overlap partially, or are flat ranges, stays whole), the chunks spread over `files`
// writer ranks (__<r>_0.distcp, balanced by bytes), streamed through the reshard Executor within its chunk budget. The result loads with
// torch.distributed.checkpoint.load into a transformers model's state_dict.
// Thread safety: reentrant.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "converters/hf/hf_export.h"
#include "formats/tensor/tensor_io.h"

namespace ckpt {

struct DcpExportOptions {
  std::optional<DType> dtype;  // cast float tensors to this; nullopt keeps each tensor's dtype
  int files = 1;               // writer ranks (.distcp files)
  bool source_chunks = false;  // chunks as the source's piece boxes (else one per tensor)
  int threads = 2;
  uint64_t max_chunk_bytes = 64ull << 20;
  bool fsync = true;
  IoMode io = IoMode::kAuto;              // how the .distcp bytes are written (formats/io/output_file.h)
  std::shared_ptr<WritePool> write_pool;  // direct writes in large requests, several in flight (null: per file)
  std::function<void(uint64_t, uint64_t)> progress;
  // Called after every byte is written, before the commit (the job's check of its SRC,
  // converters/source/source_check_job.h): an error leaves nothing at the destination.
  std::function<Status()> before_commit;
};

// The tensors to write (plan_hf_export's, without tokenizer / config files) and their chunks.
Result<HfExportPlan> plan_dcp_export(const TensorSource& src, const std::string& src_path, const DcpExportOptions& opts);

// Writes `out` (a new directory, committed by renaming `<out>.partial`); nothing is left at `out`
// on failure.
Status run_dcp_export(TensorSource& src, const HfExportPlan& plan, const std::string& out, const DcpExportOptions& opts);

}  // namespace ckpt
