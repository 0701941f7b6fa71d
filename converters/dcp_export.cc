#include "converters/dcp_export.h"

#include <algorithm>

#include "formats/torch/dcp_writer.h"
#include "reshard/executor.h"

namespace ckpt {

Result<HfExportPlan> plan_dcp_export(const TensorSource& src, const std::string& src_path, const DcpExportOptions& opts) {
  if (opts.files < 1) return Status::InvalidArgument("a DCP export needs at least one file (got " + std::to_string(opts.files) + ")");
  HfExportOptions ho;
  ho.dtype = opts.dtype;
  CKPT_ASSIGN_OR_RETURN(HfExportPlan plan, plan_hf_export(src, src_path, ho));
  plan.config.reset();  // DCP has no place for config.json or tokenizer files
  plan.copy_files.clear();
  plan.side_files.clear();
  return plan;
}

Status run_dcp_export(TensorSource& src, const HfExportPlan& plan, const std::string& out, const DcpExportOptions& opts) {
  torch::DcpWriterOptions wo;
  wo.fsync = opts.fsync;
  // Largest tensors first, each to the file with the fewest bytes so far.
  std::vector<size_t> order(plan.pieces.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto bytes = [&](size_t i) { return static_cast<uint64_t>(plan.pieces[i].region.numel()) * dtype_size(plan.pieces[i].dtype); };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return bytes(a) > bytes(b); });
  std::vector<uint64_t> load(static_cast<size_t>(std::max(1, opts.files)), 0);
  wo.piece_rank.assign(plan.pieces.size(), 0);
  for (size_t i : order) {
    size_t f = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    wo.piece_rank[i] = static_cast<int>(f);
    load[f] += bytes(i);
  }
  torch::DcpWriter sink(out, wo);
  ExecOptions eo;
  eo.threads = opts.threads;
  eo.max_chunk_bytes = opts.max_chunk_bytes;
  eo.progress = opts.progress;
  return execute(src, sink, plan.tensors, plan.pieces, nlohmann::json::object(), eo);
}

}  // namespace ckpt
