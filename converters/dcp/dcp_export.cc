#include "converters/dcp/dcp_export.h"

#include <algorithm>

#include "formats/tensor/tiling.h"
#include "formats/torch/dcp/dcp_writer.h"
#include "reshard/executor.h"

namespace ckpt {

namespace dcp_export_detail {

// The distinct boxes of the source's pieces of tensor `name` when they tile it exactly (disjoint,
// covering), else the whole tensor.
std::vector<Box> source_boxes(const TensorSource& src, const TensorMeta& t) {
  std::vector<Box> boxes;
  for (const auto& p : src.pieces()) {
    if (p.tensor != t.name) continue;
    if (p.region.is_flat()) return {Box::whole(t.shape)};
    if (std::find(boxes.begin(), boxes.end(), p.region.box) == boxes.end()) boxes.push_back(p.region.box);
  }
  std::vector<Region> regions;
  for (const Box& b : boxes) regions.push_back(Region{b});
  if (boxes.empty() || find_tiling_fault(t.shape, regions)) return {Box::whole(t.shape)};
  return boxes;
}

std::vector<Piece> source_chunk_pieces(const TensorSource& src, const HfExportPlan& plan) {
  std::vector<Piece> pieces;
  for (const auto& t : plan.tensors)
    for (const Box& b : source_boxes(src, t)) pieces.push_back(Piece{t.name, Region{b}, t.dtype});
  return pieces;
}

}  // namespace dcp_export_detail

Result<HfExportPlan> plan_dcp_export(const TensorSource& src, const std::string& src_path, const DcpExportOptions& opts) {
  if (opts.files < 1) return Status::InvalidArgument("a DCP export needs at least one file (got " + std::to_string(opts.files) + ")");
  HfExportOptions ho;
  ho.dtype = opts.dtype;
  CKPT_ASSIGN_OR_RETURN(HfExportPlan plan, plan_hf_export(src, src_path, ho));
  plan.config.reset();  // DCP has no place for config.json or tokenizer files
  plan.copy_files.clear();
  plan.side_files.clear();
  if (opts.source_chunks && !plan.aliases.empty())
    return Status::Unsupported("--source-chunks keeps the source's chunks, which an MoE model's per-expert names do not have");
  if (opts.source_chunks) plan.pieces = dcp_export_detail::source_chunk_pieces(src, plan);
  return plan;
}

Status run_dcp_export(TensorSource& src, const HfExportPlan& plan, const std::string& out, const DcpExportOptions& opts) {
  torch::DcpWriterOptions wo;
  wo.fsync = opts.fsync;
  wo.io = opts.io;
  wo.write_pool = opts.write_pool.get();
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
  return execute_export_plan(src, sink, plan, opts.threads, opts.max_chunk_bytes, opts.progress, opts.before_commit);
}

}  // namespace ckpt
