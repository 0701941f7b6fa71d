#include "reshard/chunk_pipeline.h"

#include <algorithm>
#include <optional>
#include <tuple>

#include "formats/io/output_file.h"
#include "reshard/part_io.h"

namespace ckpt {

namespace {

using Slot = ChunkPipeline::Slot;

void grow(std::vector<uint8_t>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

uint8_t* out_data(Slot& s) { return s.out.data() + s.out_at; }

// Casts and copies the raw reads of a chunk into its output buffer, and finishes its staged reads
// straight into their rows of it (worker-safe: no I/O).
Status transform(Slot& s, const std::vector<Piece>& src_pieces, StagedReads* staged, const Piece& target,
                 const CastOptions& cast) {
  const DType od = target.dtype;
  const size_t os = dtype_size(od);
  for (size_t k = 0; k < s.copies.ops.size(); ++k) {
    if (s.direct[k]) continue;
    const CopyOps::Op& r = s.copies.ops[k];
    const DType sd = src_pieces[r.part.piece].dtype;
    const Box& cb = s.copies.boxes[r.box];
    uint8_t* dst = out_data(s) + static_cast<size_t>(s.copies.box_off[r.box]) * os;
    const uint8_t* raw = s.raw.data() + s.raw_off[k];
    const size_t n = static_cast<size_t>(r.part.box.numel());
    if (s.staged[k]) {  // 2-D, same dtype: the part's first element in cb, rows cb.extent[1] apart
      const int64_t at = (r.part.box.offset[0] - cb.offset[0]) * cb.extent[1] + (r.part.box.offset[1] - cb.offset[1]);
      Status st = staged->finish_stage(r.part.piece, r.part.box, raw, dst + static_cast<size_t>(at) * os, cb.extent[1]);
      if (!st.ok()) return std::move(st).with_tensor(target.tensor);
    } else if (r.part.box == cb) {
      CKPT_RETURN_IF_ERROR(cast_with_context(raw, sd, dst, od, n, cast, target.tensor, r.part.box));
    } else if (sd == od) {
      copy_box(raw, r.part.box, dst, cb, r.part.box, os);
    } else {
      grow(s.tmp, n * os);
      CKPT_RETURN_IF_ERROR(cast_with_context(raw, sd, s.tmp.data(), od, n, cast, target.tensor, r.part.box));
      copy_box(s.tmp.data(), r.part.box, dst, cb, r.part.box, os);
    }
  }
  return Status::Ok();
}

constexpr size_t kMaxRunsPerChunk = 4096;  // a chunk of larger file ranges than max_chunk_bytes

// One part of a chunk box offered by the source as one file range.
struct ExtentPart {
  size_t cbox;
  int64_t key;  // its first element in the chunk box (row runs), or its offset in the last dimension (column blocks)
  const Box* box;
  FileExtent e;
};

// Appends `e` to `runs`, merged with the last run when back to back in one file.
void add_file_run(std::vector<FileExtent>& runs, const FileExtent& e) {
  if (!runs.empty() && runs.back().fd == e.fd && runs.back().offset + runs.back().bytes == e.offset) runs.back().bytes += e.bytes;
  else runs.push_back(e);
}

// The parts [first, last) of chunk box `cb` (sorted by key) as file runs in cb's storage order:
// row-major runs of cb that tile it in order, or (a gathering sink) column blocks that tile its
// last dimension (each spanning cb in every other dimension: each row of cb is one run per block,
// e.g. a row-parallel weight assembled from its tp ranks). False when they do neither.
bool chunk_box_runs(const Box& cb, const ExtentPart* first, const ExtentPart* last, bool rows, size_t os,
                    std::vector<FileExtent>& runs) {
  int64_t next = 0;
  if (rows) {
    for (const ExtentPart* p = first; p != last; ++p) {
      if (p->key != next) return false;
      next += p->box->numel();
      add_file_run(runs, p->e);
    }
    return next == cb.numel();
  }
  const size_t d = cb.ndim() - 1;
  for (const ExtentPart* p = first; p != last; ++p) {
    for (size_t i = 0; i < d; ++i)
      if (p->box->offset[i] != cb.offset[i] || p->box->extent[i] != cb.extent[i]) return false;
    if (p->key != cb.offset[d] + next) return false;
    next += p->box->extent[d];
  }
  if (next != cb.extent[d] || next == 0) return false;
  const int64_t nrows = cb.numel() / next;
  for (int64_t r = 0; r < nrows; ++r)
    for (const ExtentPart* p = first; p != last; ++p) {
      const uint64_t w = static_cast<uint64_t>(p->box->extent[d]) * os;
      add_file_run(runs, FileExtent{p->e.fd, p->e.offset + static_cast<uint64_t>(r) * w, w});
    }
  return true;
}

// Fills s.runs when every read of the chunk is in the target dtype and offered by the source as
// one file range, and those ranges make up the chunk in storage order (chunk_box_runs). Several
// small runs are taken only by a sink that gathers them in one call (a small run alone costs a
// syscall: read instead); runs averaging under 1 KiB are read.
void plan_chunk_extents(TensorSource& src, Slot& s, DType od, bool gathers) {
  const size_t os = dtype_size(od);
  constexpr uint64_t kMinExtentBytes = 64 << 10, kMinGatherRunBytes = 1 << 10;
  std::vector<ExtentPart> parts;
  std::vector<bool> rows(s.copies.boxes.size(), true);
  for (const CopyOps::Op& r : s.copies.ops) {
    const Box& cb = s.copies.boxes[r.box];
    if (src.pieces()[r.part.piece].dtype != od || cb.ndim() == 0) return;
    std::optional<FileExtent> e = src.file_extent(r.part.piece, r.part.box);
    if (!e || e->bytes != static_cast<uint64_t>(r.part.box.numel()) * os) return;
    std::optional<int64_t> start = row_major_run_start(cb, r.part.box);
    if (!start && !gathers) return;
    rows[r.box] = rows[r.box] && start.has_value();
    parts.push_back({r.box, start.value_or(0), &r.part.box, *e});
  }
  for (ExtentPart& p : parts)
    if (!rows[p.cbox]) p.key = p.box->offset.back();
  std::sort(parts.begin(), parts.end(), [](const ExtentPart& a, const ExtentPart& b) { return std::tie(a.cbox, a.key) < std::tie(b.cbox, b.key); });
  size_t i = 0;
  uint64_t bytes = 0;
  for (size_t cbox = 0; cbox < s.copies.boxes.size(); ++cbox) {
    size_t j = i;
    while (j < parts.size() && parts[j].cbox == cbox) ++j;
    if (!chunk_box_runs(s.copies.boxes[cbox], parts.data() + i, parts.data() + j, rows[cbox], os, s.runs)) {
      s.runs.clear();
      return;
    }
    bytes += static_cast<uint64_t>(s.copies.boxes[cbox].numel()) * os;
    i = j;
  }
  bool ok = i == parts.size();
  for (const FileExtent& x : s.runs) ok = ok && (s.runs.size() == 1 || gathers || x.bytes >= kMinExtentBytes);
  if (!ok || (s.runs.size() > 1 && bytes / s.runs.size() < kMinGatherRunBytes)) s.runs.clear();
}

}  // namespace

ChunkPipeline::ChunkPipeline(TensorSource& src, const SourceIndex& index, TensorSink& dst,
                             const std::vector<Piece>& out_pieces, const ExecOptions& opts)
    : src_(src), index_(index), dst_(dst), out_(out_pieces), opts_(opts),
      slots_(static_cast<size_t>(exec_pipeline_depth(opts.threads))) {
  // threads > 1: workers cast/copy; one writer thread writes chunks in order (write-behind) while
  // this thread reads the next ones. Source reads stay on this thread, sink writes on the writer.
  if (opts.threads > 1) {
    pool_ = std::make_unique<ThreadPool>(opts.threads - 1);
    writer_ = std::make_unique<ThreadPool>(1);
  }
  staged_ = dynamic_cast<StagedReads*>(&src);
  placement_ = dynamic_cast<const WritePlacement*>(&dst);
}

ChunkPipeline::~ChunkPipeline() { abandon(); }

Status ChunkPipeline::run(const std::vector<size_t>& sel, uint64_t total) {
  total_ = total;
  Status st = fill(sel);
  if (st.ok()) st = drain();
  if (!st.ok()) abandon();
  return st;
}

Status ChunkPipeline::fill(const std::vector<size_t>& sel) {
  for (size_t pi : sel) {
    const Piece& tp = out_[pi];
    const int64_t n = tp.region.numel();
    const int64_t chunk_elems = std::max<int64_t>(1, static_cast<int64_t>(opts_.max_chunk_bytes / dtype_size(tp.dtype)));
    // A chunk the sink copies as file ranges holds no buffer: it may be larger (max_run_chunk_bytes).
    const int64_t run_elems =
        dst_.accepts_file_extents() ? std::max<int64_t>(chunk_elems, static_cast<int64_t>(opts_.max_run_chunk_bytes / dtype_size(tp.dtype)))
                                    : chunk_elems;
    for (int64_t a = 0; a < n;) {
      CKPT_RETURN_IF_ERROR(push(pi, a, std::min(n, a + chunk_elems), std::min(n, a + run_elems)));
      a += slots_[(seq_ - 1) % slots_.size()].count;
    }
  }
  return Status::Ok();
}

Status ChunkPipeline::push(size_t piece, int64_t begin, int64_t end, int64_t end_as_runs) {
  Slot& s = slots_[seq_ % slots_.size()];
  ++seq_;
  CKPT_RETURN_IF_ERROR(finish(s));  // the chunk depth steps back: written in order
  CKPT_RETURN_IF_ERROR(prepare(s, piece, begin, end, end_as_runs));
  CKPT_RETURN_IF_ERROR(read(s));
  return transform_and_write(s);
}

// The chunk's copies, where each lands, and whether the sink takes it as file ranges: elements
// [begin, end_as_runs) when the sink takes those as file ranges, else [begin, end).
Status ChunkPipeline::prepare(Slot& s, size_t piece, int64_t begin, int64_t end, int64_t end_as_runs) {
  const Piece& tp = out_[piece];
  const std::vector<Piece>& sp = src_.pieces();
  s.piece = piece;
  s.runs.clear();
  if (end_as_runs > end) {
    auto big = copy_ops(index_, tp, begin, end_as_runs);
    if (!big.ok()) return big.take_status().with_context("target " + piece_desc(piece, tp));
    s.copies = std::move(big).value();
    plan_chunk_extents(src_, s, tp.dtype, dst_.gathers_file_runs());
    if (!s.runs.empty()) {
      // At most kMaxRunsPerChunk ranges (their list is the memory such a chunk holds, queued at the
      // sink), unless [begin, end) alone needs more: the chunk is cut after the last one kept.
      const uint64_t esize = dtype_size(tp.dtype), least = static_cast<uint64_t>(end - begin) * esize;
      uint64_t bytes = 0;
      size_t k = 0;
      while (k < s.runs.size() && (k < kMaxRunsPerChunk || bytes < least)) bytes += s.runs[k++].bytes;
      s.runs.resize(k);
      s.count = static_cast<int64_t>(bytes / esize);
      s.raw_bytes = 0;  // nothing read, nothing to transform
      return Status::Ok();
    }
  }
  s.count = end - begin;
  auto copies = copy_ops(index_, tp, begin, end);
  if (!copies.ok()) return copies.take_status().with_context("target " + piece_desc(piece, tp));
  s.copies = std::move(copies).value();
  s.direct.assign(s.copies.ops.size(), false);
  s.staged.assign(s.copies.ops.size(), false);
  s.raw_off.assign(s.copies.ops.size(), 0);
  s.raw_bytes = 0;
  for (size_t k = 0; k < s.copies.ops.size(); ++k) {
    const CopyOps::Op& r = s.copies.ops[k];
    const bool same = sp[r.part.piece].dtype == tp.dtype;
    const uint64_t stage = staged_ && same && r.part.box.ndim() == 2 ? staged_->staged_bytes(r.part.piece, r.part.box) : 0;
    if (stage > 0) {
      s.staged[k] = true;
      s.raw_off[k] = s.raw_bytes;
      s.raw_bytes += stage;
      continue;
    }
    s.direct[k] = r.part.box == s.copies.boxes[r.box] && same;
    if (!s.direct[k]) {
      s.raw_off[k] = s.raw_bytes;
      s.raw_bytes += static_cast<uint64_t>(r.part.box.numel()) * dtype_size(sp[r.part.piece].dtype);
    }
  }
  // A sink that copies files, and every part a same-dtype run of its chunk box that its source
  // holds as one file range: the chunk is those ranges in storage order, not read (a chunk of
  // whole rows split by rows over pieces, e.g. column-parallel shards, is a few ranges).
  s.runs.clear();
  if (dst_.accepts_file_extents()) plan_chunk_extents(src_, s, tp.dtype, dst_.gathers_file_runs());
  if (!s.runs.empty()) {
    s.raw_bytes = 0;  // nothing read, nothing to transform
  } else {
    // The chunk at its file offset's 4 KiB phase when the sink says where it lands (a direct-I/O
    // sink then writes it without a staging copy).
    const uint64_t os = dtype_size(tp.dtype);
    const std::optional<uint64_t> at = placement_ ? placement_->piece_file_offset(piece) : std::nullopt;
    grow(s.out, static_cast<size_t>(s.count) * os + (at ? kDirectAlignBytes : 0));
    s.out_at = at ? static_cast<size_t>((*at + static_cast<uint64_t>(begin) * os - reinterpret_cast<uintptr_t>(s.out.data())) %
                                        kDirectAlignBytes)
                  : 0;
    grow(s.raw, s.raw_bytes);
  }
  return Status::Ok();
}

Status ChunkPipeline::read(Slot& s) {
  if (!s.runs.empty()) return Status::Ok();
  const size_t os = dtype_size(out_[s.piece].dtype);
  for (size_t k = 0; k < s.copies.ops.size(); ++k) {
    const CopyOps::Op& r = s.copies.ops[k];
    uint8_t* to = s.direct[k] ? out_data(s) + static_cast<size_t>(s.copies.box_off[r.box]) * os
                              : s.raw.data() + s.raw_off[k];
    if (s.staged[k]) {
      Status st = staged_->read_stage(r.part.piece, r.part.box, to);
      if (!st.ok()) {
        const Piece& p = src_.pieces()[r.part.piece];
        return std::move(st).with_tensor(p.tensor).with_context("reading " + r.part.box.to_string() + " of source " +
                                                                 piece_desc(r.part.piece, p) + " from " + src_.describe());
      }
      continue;
    }
    CKPT_RETURN_IF_ERROR(read_part(src_, r.part, to));
  }
  return Status::Ok();
}

Status ChunkPipeline::transform_and_write(Slot& s) {
  const Piece& tp = out_[s.piece];
  s.async = false;
  if (s.raw_bytes > 0 && pool_) {
    s.async = true;
    Slot* sl = &s;
    const std::vector<Piece>* sp = &src_.pieces();
    const CastOptions cast = opts_.cast;
    StagedReads* staged = staged_;
    s.fut = pool_->submit([sl, sp, staged, &tp, cast] { return transform(*sl, *sp, staged, tp, cast); });
  } else if (s.raw_bytes > 0) {
    CKPT_RETURN_IF_ERROR(transform(s, src_.pieces(), staged_, tp, opts_.cast));
  }
  s.busy = true;
  if (!writer_) return finish(s);  // inline: write now
  Slot* sl = &s;
  s.wfut = writer_->submit([this, sl] { return write_chunk(*sl); });
  return Status::Ok();
}

Status ChunkPipeline::write_chunk(Slot& s) {
  Status st = s.async ? s.fut.get() : Status::Ok();
  if (st.ok() && failed_.load()) return Status::Internal("write skipped after an earlier error");
  const Piece& tp = out_[s.piece];
  if (st.ok()) {
    const auto os = static_cast<uint64_t>(dtype_size(tp.dtype));
    if (s.runs.empty()) st = dst_.write(s.piece, out_data(s), s.count);
    else if (s.runs.size() == 1) st = dst_.write_from_file(s.piece, s.runs[0], s.count);
    else if (dst_.gathers_file_runs()) st = dst_.write_from_files(s.piece, s.runs, s.count);
    for (size_t k = 0; s.runs.size() > 1 && !dst_.gathers_file_runs() && k < s.runs.size() && st.ok(); ++k)
      st = dst_.write_from_file(s.piece, s.runs[k], static_cast<int64_t>(s.runs[k].bytes / os));
    if (!st.ok()) st = std::move(st).with_tensor(tp.tensor).with_context("writing target " + piece_desc(s.piece, tp));
  }
  if (!st.ok()) failed_.store(true);
  return st;
}

Status ChunkPipeline::finish(Slot& s) {
  if (!s.busy) return Status::Ok();
  s.busy = false;
  CKPT_RETURN_IF_ERROR(writer_ ? s.wfut.get() : write_chunk(s));
  done_ += static_cast<uint64_t>(s.count) * dtype_size(out_[s.piece].dtype);
  if (opts_.progress) opts_.progress(done_, total_);
  return Status::Ok();
}

Status ChunkPipeline::drain() {
  for (uint64_t k = 0; k < slots_.size(); ++k) CKPT_RETURN_IF_ERROR(finish(slots_[(seq_ + k) % slots_.size()]));
  return Status::Ok();
}

void ChunkPipeline::abandon() {
  failed_.store(true);
  for (Slot& s : slots_) {
    if (s.busy && writer_) s.wfut.wait();
    else if (s.busy && s.async) s.fut.wait();
    s.busy = false;
  }
}

}  // namespace ckpt
