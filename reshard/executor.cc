#include "reshard/executor.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <future>
#include <memory>
#include <optional>

#include "formats/checked.h"
#include "formats/thread_pool.h"

namespace ckpt {

namespace {

std::string piece_desc(size_t i, const Piece& p) {
  return "piece " + std::to_string(i) + " (" + p.tensor + " " + p.region.to_string() + " " +
         std::string(dtype_name(p.dtype)) + ")";
}

// Appends r \ x to `out` (x must lie inside r): at most 2*ndim boxes, disjoint.
void subtract_box(const Box& r, const Box& x, std::vector<Box>& out) {
  Box rest = r;  // shrinks dimension by dimension to x
  for (size_t d = 0; d < r.ndim(); ++d) {
    const int64_t lo = rest.offset[d], hi = rest.offset[d] + rest.extent[d];
    const int64_t xlo = x.offset[d], xhi = x.offset[d] + x.extent[d];
    if (xlo > lo) {
      Box b = rest;
      b.extent[d] = xlo - lo;
      out.push_back(std::move(b));
    }
    if (xhi < hi) {
      Box b = rest;
      b.offset[d] = xhi;
      b.extent[d] = hi - xhi;
      out.push_back(std::move(b));
    }
    rest.offset[d] = xlo;
    rest.extent[d] = xhi - xlo;
  }
}

}  // namespace

Result<SourceIndex> SourceIndex::build(const std::vector<TensorMeta>& tensors, const std::vector<Piece>& pieces,
                                       const std::string& what) {
  SourceIndex idx;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorMeta& t = tensors[i];
    auto n = shape_numel(t.shape);
    if (!n.ok()) return n.take_status().with_tensor(t.name).with_context(what);
    if (!idx.tensor_index.emplace(t.name, i).second)
      return Status::Error("DuplicateTensor", what + ": tensor '" + t.name + "' is listed twice").with_tensor(t.name);
  }
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    auto it = idx.tensor_index.find(p.tensor);
    if (it == idx.tensor_index.end())
      return Status::Error("UnknownTensor", what + ": " + piece_desc(i, p) + " names a tensor that is not listed")
          .with_tensor(p.tensor);
    const TensorMeta& t = tensors[it->second];
    Status st = validate_box(p.region.box, t.shape);
    if (!st.ok()) return std::move(st).with_tensor(p.tensor).with_context(what + ": " + piece_desc(i, p));
    if (p.region.is_flat()) {
      const int64_t n = p.region.box.numel();
      if (p.region.flat_begin < 0 || p.region.flat_begin > p.region.flat_end || p.region.flat_end > n)
        return Status::Error("FlatRangeOutOfBounds", what + ": " + piece_desc(i, p) + ": flat range " +
                                                              std::to_string(p.region.flat_begin) + ".." +
                                                              std::to_string(p.region.flat_end) + " outside 0.." +
                                                              std::to_string(n) + " of its box")
            .with_tensor(p.tensor);
    } else if (p.region.flat_end != -1) {
      return Status::Error("FlatRangeOutOfBounds", what + ": " + piece_desc(i, p) + ": flat_end " +
                                                            std::to_string(p.region.flat_end) + " is negative")
          .with_tensor(p.tensor);
    }
    auto& entries = idx.by_tensor[p.tensor];
    for (Box& b : p.region.boxes())
      if (!b.empty() || b.ndim() == 0) entries.push_back({i, std::move(b)});
  }
  return idx;
}

const std::vector<SourceIndex::Entry>* SourceIndex::find(const std::string& tensor) const {
  auto it = by_tensor.find(tensor);
  return it == by_tensor.end() ? nullptr : &it->second;
}

Result<std::vector<SourcePart>> assign_box(const SourceIndex& index, const std::string& tensor, const Box& box) {
  std::vector<SourcePart> parts;
  if (box.empty() && box.ndim() > 0) return parts;
  const auto* entries = index.find(tensor);
  if (!index.tensor_index.count(tensor))
    return Status::Error("TensorNotFound", "the source has no tensor '" + tensor + "'")
        .with_tensor(tensor);
  std::vector<Box> remaining{box}, next;
  if (entries) {
    for (const auto& e : *entries) {
      if (remaining.empty()) break;
      if (e.box.ndim() != box.ndim()) continue;
      next.clear();
      for (const Box& r : remaining) {
        std::optional<Box> x = intersect(r, e.box);
        if (r.ndim() == 0) x = r;  // rank 0: a piece holding the scalar covers it
        if (!x) {
          next.push_back(r);
          continue;
        }
        subtract_box(r, *x, next);
        parts.push_back({e.piece, std::move(*x)});
      }
      remaining.swap(next);
    }
  }
  if (!remaining.empty()) {
    int64_t missing = 0;
    for (const Box& r : remaining) missing += r.numel();
    return Status::Error("RegionNotCovered",
                         "no source piece holds box " + remaining.front().to_string() + " of tensor '" + tensor +
                             "' (requested " + box.to_string() + ", " + std::to_string(missing) + " of " +
                             std::to_string(box.numel()) + " elements missing)")
        .with_tensor(tensor);
  }
  return parts;
}

namespace {

// Reads part `p` (global box inside source piece p.piece) into `dst` in the piece's stored dtype.
Status read_part(TensorSource& src, const SourcePart& p, void* dst) {
  Status st = src.read(p.piece, p.box, dst);
  if (!st.ok()) {
    const Piece& sp = src.pieces()[p.piece];
    return std::move(st).with_tensor(sp.tensor).with_context("reading " + p.box.to_string() + " of source " +
                                                             piece_desc(p.piece, sp) + " from " + src.describe());
  }
  return st;
}

Status cast_with_context(const void* in, DType from, void* out, DType to, size_t n, const CastOptions& cast,
                         const std::string& tensor, const Box& box) {
  if (from == to) {
    std::memcpy(out, in, n * dtype_size(to));
    return Status::Ok();
  }
  Status st = cast_elements(in, from, out, to, n, cast);
  if (!st.ok())
    return std::move(st).with_tensor(tensor).with_context("casting " + box.to_string() + " of '" + tensor + "' from " +
                                                          std::string(dtype_name(from)) + " to " +
                                                          std::string(dtype_name(to)));
  return st;
}

}  // namespace

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
    if (p.region.is_flat() && (p.region.flat_begin < 0 || p.region.flat_begin > p.region.flat_end ||
                               p.region.flat_end > p.region.box.numel()))
      return Status::InvalidArgument("target " + piece_desc(i, p) + ": flat range outside its box").with_tensor(p.tensor);
    for (const Box& b : p.region.boxes()) {
      auto parts = assign_box(index, p.tensor, b);
      if (!parts.ok()) return parts.take_status().with_context("target " + piece_desc(i, p));
    }
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

// One read of a chunk: source part, where it lands.
struct ChunkRead {
  SourcePart part;
  size_t cbox;          // index of the chunk box it lies in
  bool direct;          // read straight into the output buffer (same dtype, whole chunk box)
  uint64_t raw_off = 0; // byte offset in the raw buffer (when not direct)
};

// Buffers and work of one chunk in flight. Buffers are reused (never shrunk).
struct Slot {
  std::vector<uint8_t> out, raw, tmp;
  std::vector<Box> cboxes;          // the chunk's boxes, in storage order
  std::vector<int64_t> cbox_off;    // element offset of each box in the chunk
  std::vector<ChunkRead> reads;
  // The chunk as file ranges in storage order: the sink copies them file to file instead of the
  // chunk being read. Empty: read into `out`.
  struct Range {
    FileExtent e;
    int64_t count;  // elements
  };
  std::vector<Range> extents;
  size_t piece = 0;
  int64_t count = 0;
  bool busy = false;     // read; its transform and write may still be pending
  bool async = false;    // `fut` holds its transform
  std::future<Status> fut;   // transform (worker pool)
  std::future<Status> wfut;  // write (writer thread), when there is one
};

void grow(std::vector<uint8_t>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

// Casts and copies the raw reads of a chunk into its output buffer (worker-safe: no I/O).
Status transform(Slot& s, const std::vector<Piece>& src_pieces, const Piece& target, const CastOptions& cast) {
  const DType od = target.dtype;
  const size_t os = dtype_size(od);
  for (const ChunkRead& r : s.reads) {
    if (r.direct) continue;
    const DType sd = src_pieces[r.part.piece].dtype;
    const Box& cb = s.cboxes[r.cbox];
    uint8_t* dst = s.out.data() + static_cast<size_t>(s.cbox_off[r.cbox]) * os;
    const uint8_t* raw = s.raw.data() + r.raw_off;
    const size_t n = static_cast<size_t>(r.part.box.numel());
    if (r.part.box == cb) {
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

// Fills s.extents when every read of the chunk is in the target dtype and is
// a row-major run of its chunk box offered by the source as a file range, and the runs of
// each chunk box tile it in order. Runs back to back in one file merge into one range; a chunk of
// several ranges is taken only when none is small (small ones cost a syscall each: read instead).
void plan_chunk_extents(TensorSource& src, Slot& s, DType od) {
  const size_t os = dtype_size(od);
  constexpr uint64_t kMinExtentBytes = 64 << 10;
  struct Run {
    size_t cbox;
    int64_t start;  // element index in its chunk box
    int64_t n;
    FileExtent e;
  };
  std::vector<Run> runs;
  for (const ChunkRead& r : s.reads) {
    const Box& cb = s.cboxes[r.cbox];
    if (src.pieces()[r.part.piece].dtype != od) return;
    std::optional<int64_t> start = row_major_run_start(cb, r.part.box);
    if (!start) return;
    std::optional<FileExtent> e = src.file_extent(r.part.piece, r.part.box);
    if (!e || e->bytes != static_cast<uint64_t>(r.part.box.numel()) * os) return;
    runs.push_back({r.cbox, *start, r.part.box.numel(), *e});
  }
  std::sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) { return std::tie(a.cbox, a.start) < std::tie(b.cbox, b.start); });
  size_t cbox = 0;
  int64_t next = 0;  // expected start of the next run in chunk box `cbox`
  bool ok = !runs.empty();
  for (const Run& r : runs) {
    if (r.cbox != cbox) {
      ok = ok && r.cbox == cbox + 1 && next == s.cboxes[cbox].numel();
      cbox = r.cbox;
      next = 0;
    }
    ok = ok && r.start == next;
    if (!ok) break;
    next += r.n;
    FileExtent* last = s.extents.empty() ? nullptr : &s.extents.back().e;
    if (last && last->fd == r.e.fd && last->offset + last->bytes == r.e.offset) {
      last->bytes += r.e.bytes;  // back to back in one file: one range
      s.extents.back().count += r.n;
    } else {
      s.extents.push_back({r.e, r.n});
    }
  }
  // Every chunk box tiled in order (so the ranges hold exactly the chunk); small ranges only alone.
  ok = ok && cbox + 1 == s.cboxes.size() && next == s.cboxes[cbox].numel();
  for (const Slot::Range& x : s.extents) ok = ok && (s.extents.size() == 1 || x.e.bytes >= kMinExtentBytes);
  if (!ok) s.extents.clear();
}

}  // namespace

Status execute_into(TensorSource& src, const SourceIndex& index, TensorSink& dst,
                    const std::vector<TensorMeta>& out_tensors, const std::vector<Piece>& out_pieces,
                    const ExecOptions& opts) {
  (void)out_tensors;
  std::vector<size_t> sel = opts.only_pieces;
  if (sel.empty()) {
    sel = dst.write_order();  // the sink's sequential order, when it has one
    if (sel.size() != out_pieces.size()) {
      sel.resize(out_pieces.size());
      for (size_t i = 0; i < sel.size(); ++i) sel[i] = i;
    }
  }
  uint64_t total = 0;
  for (size_t i : sel) {
    if (i >= out_pieces.size()) return Status::Internal("selected target piece out of range");
    total += static_cast<uint64_t>(out_pieces[i].region.numel()) * dtype_size(out_pieces[i].dtype);
  }
  const std::vector<Piece>& sp = src.pieces();
  const int depth = exec_pipeline_depth(opts.threads);
  // threads > 1: workers cast/copy; one writer thread writes chunks in order (write-behind) while
  // this thread reads the next ones. Source reads stay on this thread, sink writes on the writer.
  std::vector<Slot> slots(static_cast<size_t>(depth));  // outlives the threads below
  std::unique_ptr<ThreadPool> pool, writer;
  if (opts.threads > 1) {
    pool = std::make_unique<ThreadPool>(opts.threads - 1);
    writer = std::make_unique<ThreadPool>(1);
  }
  uint64_t done = 0;
  uint64_t seq = 0;  // chunk sequence number
  std::atomic<bool> failed{false};  // set by the first failed transform or write: later writes are skipped

  // Waits for the chunk's transform (if any) and writes it (on the writer thread when there is one).
  auto write_chunk = [&](Slot& s) -> Status {
    Status st = s.async ? s.fut.get() : Status::Ok();
    if (st.ok() && failed.load()) return Status::Internal("write skipped after an earlier error");
    const Piece& tp = out_pieces[s.piece];
    if (st.ok()) {
      if (s.extents.empty()) st = dst.write(s.piece, s.out.data(), s.count);
      for (size_t k = 0; k < s.extents.size() && st.ok(); ++k) st = dst.write_from_file(s.piece, s.extents[k].e, s.extents[k].count);
      if (!st.ok()) st = std::move(st).with_tensor(tp.tensor).with_context("writing target " + piece_desc(s.piece, tp));
    }
    if (!st.ok()) failed.store(true);
    return st;
  };
  // Waits until a slot's chunk is written, frees the slot, reports progress.
  auto finish = [&](Slot& s) -> Status {
    if (!s.busy) return Status::Ok();
    s.busy = false;
    Status st = writer ? s.wfut.get() : write_chunk(s);
    if (!st.ok()) return st;
    done += static_cast<uint64_t>(s.count) * dtype_size(out_pieces[s.piece].dtype);
    if (opts.progress) opts.progress(done, total);
    return Status::Ok();
  };
  auto abandon = [&]() {  // after an error: wait for workers and the writer, write nothing more
    failed.store(true);
    for (Slot& s : slots) {
      if (s.busy && writer) s.wfut.wait();
      else if (s.busy && s.async) s.fut.wait();
      s.busy = false;
    }
  };
  auto drain = [&]() -> Status {  // in chunk order, waiting for every pending write
    for (uint64_t k = 0; k < static_cast<uint64_t>(depth); ++k) {
      Status st = finish(slots[(seq + k) % slots.size()]);
      if (!st.ok()) {
        abandon();
        return st;
      }
    }
    return Status::Ok();
  };

  for (size_t pi : sel) {
    const Piece& tp = out_pieces[pi];
    const size_t os = dtype_size(tp.dtype);
    const int64_t n = tp.region.numel();
    const int64_t chunk_elems = std::max<int64_t>(1, static_cast<int64_t>(opts.max_chunk_bytes / os));
    const int64_t base = tp.region.is_flat() ? tp.region.flat_begin : 0;
    for (int64_t a = 0; a < n; a += chunk_elems) {
      const int64_t b = std::min(n, a + chunk_elems);
      Slot& s = slots[seq % slots.size()];
      ++seq;
      Status st = finish(s);  // the chunk depth steps back: written in order
      if (!st.ok()) {
        abandon();
        return st;
      }
      s.piece = pi;
      s.count = b - a;
      s.cboxes = tp.region.box.ndim() == 0 ? std::vector<Box>{tp.region.box}
                                            : flat_range_to_boxes(tp.region.box, base + a, base + b);
      s.cbox_off.clear();
      s.reads.clear();
      int64_t off = 0;
      uint64_t raw_bytes = 0;
      for (size_t k = 0; k < s.cboxes.size(); ++k) {
        s.cbox_off.push_back(off);
        off += s.cboxes[k].numel();
        auto parts = assign_box(index, tp.tensor, s.cboxes[k]);
        if (!parts.ok()) {
          abandon();
          return parts.take_status().with_context("target " + piece_desc(pi, tp));
        }
        for (SourcePart& p : *parts) {
          ChunkRead r{std::move(p), k, false, 0};
          r.direct = (r.part.box == s.cboxes[k]) && sp[r.part.piece].dtype == tp.dtype;
          if (!r.direct) {
            r.raw_off = raw_bytes;
            raw_bytes += static_cast<uint64_t>(r.part.box.numel()) * dtype_size(sp[r.part.piece].dtype);
          }
          s.reads.push_back(std::move(r));
        }
      }
      // A sink that copies files, and every part a same-dtype run of its chunk box that its source
      // holds as one file range: the chunk is those ranges in storage order, not read (a chunk of
      // whole rows split by rows over pieces, e.g. column-parallel shards, is a few ranges).
      s.extents.clear();
      if (dst.accepts_file_extents()) plan_chunk_extents(src, s, tp.dtype);
      if (s.extents.empty()) {
        grow(s.out, static_cast<size_t>(s.count) * os);
        grow(s.raw, raw_bytes);
      }
      for (const ChunkRead& r : s.reads) {
        if (!s.extents.empty()) break;
        uint8_t* to = r.direct ? s.out.data() + static_cast<size_t>(s.cbox_off[r.cbox]) * os : s.raw.data() + r.raw_off;
        st = read_part(src, r.part, to);
        if (!st.ok()) {
          abandon();
          return st;
        }
      }
      s.async = false;
      if (!s.extents.empty()) raw_bytes = 0;  // nothing read, nothing to transform
      if (raw_bytes > 0 && pool) {
        s.async = true;
        Slot* sl = &s;
        const CastOptions cast = opts.cast;
        s.fut = pool->submit([sl, &sp, &tp, cast] { return transform(*sl, sp, tp, cast); });
      } else if (raw_bytes > 0) {
        st = transform(s, sp, tp, opts.cast);
        if (!st.ok()) {
          abandon();
          return st;
        }
      }
      s.busy = true;
      if (writer) {
        Slot* sl = &s;
        s.wfut = writer->submit([sl, &write_chunk] { return write_chunk(*sl); });
      } else {
        st = finish(s);  // inline: write now
        if (!st.ok()) {
          abandon();
          return st;
        }
      }
    }
  }
  return drain();
}

Status execute(TensorSource& src, TensorSink& dst, const std::vector<TensorMeta>& out_tensors,
               const std::vector<Piece>& out_pieces, const nlohmann::json& metadata, const ExecOptions& opts) {
  CKPT_ASSIGN_OR_RETURN(SourceIndex index, SourceIndex::build(src));
  CKPT_RETURN_IF_ERROR(check_plan_coverage(index, out_tensors, out_pieces, opts.only_pieces));
  CKPT_RETURN_IF_ERROR(dst.begin(out_tensors, out_pieces, metadata));
  Status st = execute_into(src, index, dst, out_tensors, out_pieces, opts);
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
