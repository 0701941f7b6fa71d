#include "reshard/executor.h"

#include <algorithm>
#include <unordered_map>

#include "reshard/chunk_pipeline.h"
#include "reshard/part_io.h"

namespace ckpt {

Status read_global_box(TensorSource& src, const SourceIndex& index, const std::string& tensor, const Box& box,
                       DType out, void* dst, const CastOptions& cast) {
  CKPT_ASSIGN_OR_RETURN(std::vector<SourcePart> parts, assign_box(index, tensor, box));
  const size_t os = dtype_size(out);
  std::vector<uint8_t> raw, tmp;
  for (const SourcePart& p : parts) {
    const DType sd = src.pieces()[p.piece].dtype;
    const int64_t n = p.box.numel();
    if (p.box == box && sd == out) {  // one piece holds all of it: read in place
      CKPT_RETURN_IF_ERROR(read_part(src, p, dst));
      continue;
    }
    raw.resize(static_cast<size_t>(n) * dtype_size(sd));
    CKPT_RETURN_IF_ERROR(read_part(src, p, raw.data()));
    if (p.box == box) {
      CKPT_RETURN_IF_ERROR(cast_with_context(raw.data(), sd, dst, out, static_cast<size_t>(n), cast, tensor, p.box));
      continue;
    }
    const void* from = raw.data();
    if (sd != out) {
      tmp.resize(static_cast<size_t>(n) * os);
      CKPT_RETURN_IF_ERROR(cast_with_context(raw.data(), sd, tmp.data(), out, static_cast<size_t>(n), cast, tensor, p.box));
      from = tmp.data();
    }
    copy_box(from, p.box, dst, box, p.box, os);
  }
  return Status::Ok();
}

// One chunk being read, one being written, one per cast worker.
int exec_pipeline_depth(int threads) { return threads <= 1 ? 1 : threads + 1; }

uint64_t exec_peak_bytes(const ExecOptions& opts, size_t max_src_elem, size_t min_out_elem) {
  const uint64_t chunk = std::max<uint64_t>(opts.max_chunk_bytes, min_out_elem);
  const uint64_t elems = chunk / std::max<size_t>(min_out_elem, 1);
  const uint64_t per_slot = chunk + elems * max_src_elem + chunk;  // out + raw + tmp (worst case)
  return per_slot * static_cast<uint64_t>(exec_pipeline_depth(opts.threads));
}

uint64_t exec_chunk_bytes(uint64_t budget, int threads, size_t max_src_elem, size_t min_out_elem) {
  const uint64_t depth = static_cast<uint64_t>(exec_pipeline_depth(threads));
  const uint64_t out = std::max<size_t>(min_out_elem, 1);
  const uint64_t ratio = (std::max<size_t>(max_src_elem, 1) + out - 1) / out;  // raw bytes per output byte
  return std::max<uint64_t>(64u << 10, budget / (depth * (2 + ratio)));       // out + raw + tmp per slot
}

Status check_plan_coverage(const SourceIndex& index, const std::vector<TensorMeta>& out_tensors,
                           const std::vector<Piece>& out_pieces, const std::vector<size_t>& only_pieces) {
  std::unordered_map<std::string, const TensorMeta*> metas;
  for (const auto& t : out_tensors) metas[t.name] = &t;
  auto check_one = [&](size_t i) -> Status {
    if (i >= out_pieces.size())
      return Status::Internal("selected target piece " + std::to_string(i) + " of " + std::to_string(out_pieces.size()));
    const Piece& p = out_pieces[i];
    auto it = metas.find(p.tensor);
    if (it == metas.end())
      return Status::InvalidArgument("target " + piece_desc(i, p) + " names a tensor not in the target tensor list")
          .with_tensor(p.tensor);
    Status st = validate_box(p.region.box, it->second->shape);
    if (!st.ok()) return std::move(st).with_tensor(p.tensor).with_context("target " + piece_desc(i, p));
    if (!flat_range_fits(p.region))
      return Status::InvalidArgument("target " + piece_desc(i, p) + ": flat range outside its box").with_tensor(p.tensor);
    auto copies = copy_ops(index, p, 0, p.region.numel());
    if (!copies.ok()) return copies.take_status().with_context("target " + piece_desc(i, p));
    return Status::Ok();
  };
  if (only_pieces.empty()) {
    for (size_t i = 0; i < out_pieces.size(); ++i) CKPT_RETURN_IF_ERROR(check_one(i));
  } else {
    for (size_t i : only_pieces) CKPT_RETURN_IF_ERROR(check_one(i));
  }
  return Status::Ok();
}


namespace {

// The target pieces to fill, in order: opts.only_pieces, else the sink's sequential order when it
// has one, else all of them in index order.
Result<std::vector<size_t>> selected_pieces(const TensorSink& dst, size_t n, const ExecOptions& opts) {
  std::vector<size_t> sel = opts.only_pieces;
  if (sel.empty()) {
    sel = dst.write_order();
    if (sel.size() != n) {
      sel.resize(n);
      for (size_t i = 0; i < sel.size(); ++i) sel[i] = i;
    }
  }
  for (size_t i : sel)
    if (i >= n) return Status::Internal("selected target piece out of range");
  return sel;
}

}  // namespace

Status execute_into(TensorSource& src, const SourceIndex& index, TensorSink& dst, const std::vector<Piece>& out_pieces,
                    const ExecOptions& opts) {
  CKPT_ASSIGN_OR_RETURN(std::vector<size_t> sel, selected_pieces(dst, out_pieces.size(), opts));
  uint64_t total = 0;
  for (size_t i : sel) total += static_cast<uint64_t>(out_pieces[i].region.numel()) * dtype_size(out_pieces[i].dtype);
  ChunkPipeline pipeline(src, index, dst, out_pieces, opts);
  return pipeline.run(sel, total);
}

Status execute(TensorSource& src, TensorSink& dst, const std::vector<TensorMeta>& out_tensors,
               const std::vector<Piece>& out_pieces, const nlohmann::json& metadata, const ExecOptions& opts) {
  CKPT_ASSIGN_OR_RETURN(SourceIndex index, SourceIndex::build(src));
  CKPT_RETURN_IF_ERROR(check_plan_coverage(index, out_tensors, out_pieces, opts.only_pieces));
  CKPT_RETURN_IF_ERROR(dst.begin(out_tensors, out_pieces, metadata));
  Status st = execute_into(src, index, dst, out_pieces, opts);
  if (st.ok() && opts.before_commit) st = opts.before_commit();
  if (!st.ok()) {
    dst.abort();
    return st;
  }
  st = dst.commit();
  if (!st.ok()) {
    dst.abort();
    return st;
  }
  return Status::Ok();
}

}  // namespace ckpt
