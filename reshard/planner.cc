#include "reshard/planner.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <unordered_map>

#include "formats/base/byte_size.h"
#include "formats/base/checked.h"
#include "formats/store/run_dir.h"
#include "formats/tensor/tiling.h"
#include "reshard/layout/holdings.h"
#include "reshard/layout/overlap_cells.h"
#include "reshard/layout/tensor_placement.h"

namespace ckpt {

namespace {

Status bad_placement(const TensorMeta& t, const std::string& msg) {
  return Status::Internal("sharding rules gave a bad placement for '" + t.name + "': " + msg).with_tensor(t.name);
}

Region make_region(const Box& box, int64_t a, int64_t b) {
  if (a == 0 && b == box.numel()) return Region{box};
  return Region{box, a, b};
}

bool box_less(const Box& x, const Box& y) {
  if (x.offset != y.offset) return x.offset < y.offset;
  return x.extent < y.extent;
}

// Distinct boxes of one tensor's holdings, sorted; *disjoint: every two of them are disjoint
// (always so under symmetric layouts; general layouts overlap them: see reshard/layout/overlap_cells.h).
std::vector<Box> distinct_boxes(const std::vector<Holding>& hs, const std::vector<size_t>& list, bool* disjoint) {
  std::vector<Box> distinct;
  for (size_t h : list)
    if (std::find(distinct.begin(), distinct.end(), hs[h].box) == distinct.end()) distinct.push_back(hs[h].box);
  std::sort(distinct.begin(), distinct.end(), box_less);
  *disjoint = !find_box_overlap(distinct).has_value();
  return distinct;
}

// An elementary segment [a, b) of one distinct box of one tensor: every holding of that box
// either covers it whole or misses it; or (box == kCell) cell `a` of the tensor's overlap cells.
// `holders`: ascending ranks; `rank`: the writer chosen.
constexpr size_t kCell = static_cast<size_t>(-1);

struct Segment {
  size_t tensor, box;
  int64_t a, b;
  uint64_t bytes;
  std::vector<int> holders;
  int rank = -1;
};

// Cuts the holdings of tensor `i` (over `boxes`) at every interval end into segments.
void cut_segments(size_t i, const std::vector<Box>& boxes, const std::vector<Holding>& hs,
                  const std::vector<size_t>& list, size_t elem, std::vector<Segment>& out) {
  for (size_t bi = 0; bi < boxes.size(); ++bi) {
    std::vector<int64_t> cuts;
    for (size_t h : list)
      if (hs[h].box == boxes[bi]) cuts.insert(cuts.end(), {hs[h].a, hs[h].b});
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      Segment s{i, bi, cuts[c], cuts[c + 1], static_cast<uint64_t>(cuts[c + 1] - cuts[c]) * elem, {}};
      for (size_t h : list)
        if (hs[h].box == boxes[bi] && hs[h].a <= s.a && s.b <= hs[h].b) s.holders.push_back(hs[h].rank);
      std::sort(s.holders.begin(), s.holders.end());
      s.holders.erase(std::unique(s.holders.begin(), s.holders.end()), s.holders.end());
      if (!s.holders.empty()) out.push_back(std::move(s));
    }
  }
}

// Balanced de-duplication: segments with one holder go to it; then the shared ones, largest
// first (ties: tensor order, box order, start), each to its holder with the fewest bytes so far
// (ties: lowest rank). Deterministic: depends on the segments only.
void assign_balanced(std::vector<Segment>& segs, int world) {
  std::vector<uint64_t> load(static_cast<size_t>(world), 0);
  std::vector<size_t> shared;
  for (size_t k = 0; k < segs.size(); ++k) {
    if (segs[k].holders.size() == 1) {
      segs[k].rank = segs[k].holders[0];
      load[static_cast<size_t>(segs[k].rank)] += segs[k].bytes;
    } else {
      shared.push_back(k);
    }
  }
  std::stable_sort(shared.begin(), shared.end(), [&](size_t x, size_t y) { return segs[x].bytes > segs[y].bytes; });
  for (size_t k : shared) {
    int best = segs[k].holders[0];
    for (int r : segs[k].holders)
      if (load[static_cast<size_t>(r)] < load[static_cast<size_t>(best)]) best = r;
    segs[k].rank = best;
    load[static_cast<size_t>(best)] += segs[k].bytes;
  }
}

}  // namespace

namespace {

// The cells of one tensor whose boxes overlap, as segments (box kCell, a = the cell's index).
void cell_segments(size_t i, const OverlapCells& oc, size_t elem, std::vector<Segment>& out) {
  for (size_t c = 0; c < oc.cells.size(); ++c)
    out.push_back({i, kCell, static_cast<int64_t>(c), static_cast<int64_t>(c) + 1,
                   static_cast<uint64_t>(oc.cells[c].box.numel()) * elem, oc.cells[c].holders});
}

// The stored regions of tensor `i` from its assigned segments segs[k0, k1), in rank order.
// Fast path (boxes disjoint): adjacent segments of one box written by the same rank become one
// region (a rank holds one interval of a box, so the merged range stays inside what it holds).
std::vector<RankRegion> tensor_regions(const std::vector<Segment>& segs, size_t k0, size_t k1,
                                       const std::vector<Box>& boxes, const OverlapCells* cells) {
  std::vector<RankRegion> out;
  if (cells) {
    std::vector<int> writer;
    for (size_t k = k0; k < k1; ++k) writer.push_back(segs[k].rank);
    for (auto& [rank, box] : merge_cells(*cells, writer)) out.push_back({rank, Region{std::move(box)}});
    std::stable_sort(out.begin(), out.end(), [](const RankRegion& x, const RankRegion& y) { return x.rank < y.rank; });
    return out;
  }
  struct Run {
    int rank;
    size_t box;
    int64_t a, b;
  };
  std::vector<Run> runs;
  for (size_t k = k0; k < k1; ++k) {
    const Segment& s = segs[k];
    if (!runs.empty() && runs.back().rank == s.rank && runs.back().box == s.box && runs.back().b == s.a)
      runs.back().b = s.b;
    else
      runs.push_back({s.rank, s.box, s.a, s.b});
  }
  std::stable_sort(runs.begin(), runs.end(), [](const Run& x, const Run& y) { return x.rank < y.rank; });
  for (const Run& r : runs) out.push_back({r.rank, make_region(boxes[r.box], r.a, r.b)});
  return out;
}

}  // namespace

Result<std::vector<std::vector<RankRegion>>> place_tensors(const std::vector<TensorMeta>& tensors,
                                                           const Layout& layout, const ShardingRules& rules) {
  CKPT_RETURN_IF_ERROR(layout.validate());
  CKPT_RETURN_IF_ERROR(check_layout_views(layout, rules));
  CKPT_ASSIGN_OR_RETURN(std::vector<Holding> hs, layout_holdings(tensors, layout, rules));
  std::vector<std::vector<size_t>> by_tensor(tensors.size());
  for (size_t h = 0; h < hs.size(); ++h) by_tensor[hs[h].tensor].push_back(h);
  std::vector<std::vector<Box>> boxes(tensors.size());
  std::vector<std::unique_ptr<OverlapCells>> cells(tensors.size());  // tensors whose boxes overlap
  std::vector<size_t> first(tensors.size() + 1, 0);                  // tensor i: segs[first[i], first[i+1])
  std::vector<Segment> segs;  // tensor order; box order and start order, or cell order
  for (size_t i = 0; i < tensors.size(); ++i) {
    first[i] = segs.size();
    bool disjoint = true;
    boxes[i] = distinct_boxes(hs, by_tensor[i], &disjoint);
    const size_t elem = dtype_size(tensors[i].dtype);
    if (disjoint) {
      cut_segments(i, boxes[i], hs, by_tensor[i], elem, segs);
    } else {
      cells[i] = std::make_unique<OverlapCells>(cut_overlap_cells(hs, by_tensor[i]));
      cell_segments(i, *cells[i], elem, segs);
    }
    // Coverage: the segments tile the tensor (the rules' boxes must cover it; checked by the
    // sink's validator, and here for a clear message).
    int64_t covered = 0, want = 1;
    for (size_t k = first[i]; k < segs.size(); ++k)
      covered += segs[k].box == kCell ? cells[i]->cells[static_cast<size_t>(segs[k].a)].box.numel() : segs[k].b - segs[k].a;
    for (int64_t e : tensors[i].shape) want *= e;
    if (covered != want)
      return bad_placement(tensors[i], "the ranks hold " + std::to_string(covered) + " of " + std::to_string(want) +
                                           " elements of shape " + shape_to_string(tensors[i].shape));
  }
  first[tensors.size()] = segs.size();
  assign_balanced(segs, layout.world_size());
  std::vector<std::vector<RankRegion>> out(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) out[i] = tensor_regions(segs, first[i], first[i + 1], boxes[i], cells[i].get());
  return out;
}

Result<std::vector<Piece>> rank_view(const std::vector<TensorMeta>& tensors, const Layout& layout,
                                     const ShardingRules& rules, int rank) {
  CKPT_RETURN_IF_ERROR(layout.validate());
  CKPT_RETURN_IF_ERROR(check_layout_views(layout, rules));
  if (rank < 0 || rank >= layout.world_size())
    return Status::InvalidArgument("rank " + std::to_string(rank) + " outside world size " +
                                   std::to_string(layout.world_size()));
  CKPT_ASSIGN_OR_RETURN(std::vector<Holding> hs, layout_holdings(tensors, layout, rules, rank));
  std::stable_sort(hs.begin(), hs.end(), [](const Holding& x, const Holding& y) { return x.tensor < y.tensor; });
  std::vector<Piece> out;
  for (const Holding& h : hs) out.push_back({tensors[h.tensor].name, make_region(h.box, h.a, h.b), tensors[h.tensor].dtype});
  return out;
}

Result<Plan> make_plan(const std::vector<TensorMeta>& src_tensors, const std::vector<Piece>& src_pieces,
                       const nlohmann::json& src_metadata, const Layout& target, const ShardingRules& rules,
                       const ExecOptions& exec) {
  CKPT_ASSIGN_OR_RETURN(SourceIndex index, SourceIndex::build(src_tensors, src_pieces));
  CKPT_ASSIGN_OR_RETURN(auto placed, place_tensors(src_tensors, target, rules));
  Plan plan;
  plan.layout = target;
  plan.tensors = src_tensors;
  struct Item {
    int rank;
    size_t tensor;
    Region region;
  };
  std::vector<Item> items;
  for (size_t i = 0; i < placed.size(); ++i)
    for (auto& rr : placed[i]) items.push_back({rr.rank, i, std::move(rr.region)});
  std::sort(items.begin(), items.end(), [](const Item& x, const Item& y) {
    if (x.rank != y.rank) return x.rank < y.rank;
    if (x.tensor != y.tensor) return x.tensor < y.tensor;
    if (x.region.box != y.region.box) return box_less(x.region.box, y.region.box);
    return x.region.flat_begin < y.region.flat_begin;
  });
  for (auto& it : items) {
    plan.pieces.push_back({src_tensors[it.tensor].name, std::move(it.region), src_tensors[it.tensor].dtype});
    plan.piece_rank.push_back(it.rank);
  }
  // Files, coverage and bytes.
  size_t max_src = 1, min_out = 8;
  for (const Piece& p : src_pieces) {
    max_src = std::max(max_src, dtype_size(p.dtype));
    plan.source_bytes += static_cast<uint64_t>(p.region.numel()) * dtype_size(p.dtype);
  }
  for (size_t k = 0; k < plan.pieces.size(); ++k) {
    const Piece& p = plan.pieces[k];
    const int r = plan.piece_rank[k];
    if (plan.files.empty() || plan.files.back().rank != r) plan.files.push_back({r, store::shard_file_name(r), {}, 0, 0});
    FileWork& f = plan.files.back();
    f.pieces.push_back(k);
    const uint64_t wb = static_cast<uint64_t>(p.region.numel()) * dtype_size(p.dtype);
    min_out = std::min(min_out, dtype_size(p.dtype));
    f.bytes_written += wb;
    plan.bytes_written += wb;
    auto copies = copy_ops(index, p, 0, p.region.numel());
    if (!copies.ok())
      return copies.take_status().with_context("target piece " + std::to_string(k) + " (" + p.tensor + " " +
                                               p.region.to_string() + ", " + f.file + ")");
    for (const CopyOps::Op& op : copies->ops) {
      const uint64_t rb = static_cast<uint64_t>(op.part.box.numel()) * dtype_size(src_pieces[op.part.piece].dtype);
      f.bytes_read += rb;
      plan.bytes_read += rb;
    }
  }
  // Chunks never exceed the largest target piece: size the bound with that.
  uint64_t largest = 1;
  for (const FileWork& f : plan.files)
    for (size_t k : f.pieces)
      largest = std::max<uint64_t>(largest, static_cast<uint64_t>(plan.pieces[k].region.numel()) * dtype_size(plan.pieces[k].dtype));
  ExecOptions sized = exec;
  sized.max_chunk_bytes = std::min<uint64_t>(exec.max_chunk_bytes, largest);
  plan.peak_buffer = exec_peak_bytes(sized, max_src, min_out);
  plan.metadata = src_metadata.is_object() ? src_metadata : nlohmann::json::object();
  nlohmann::json lj = target.to_json();
  if (target.zero == 1)
    lj["zero_shard"] = {{"pad_multiple_elements", kZeroPadElements * target.num_pipelines()},
                        {"buffer", "per (pipeline stage, tp rank, optimizer kind): TP-local boxes of the stage's "
                                   "optimizer tensors of that kind in tensor-list order, flattened row-major, "
                                   "concatenated, zero-padded at the end, split evenly over dp ranks"}};
  if (target.zero == 1 && target.expert_parallel())
    lj["zero_shard"]["expert_buffer"] = "per (pipeline stage, group of ranks holding the same expert boxes, optimizer kind): "
                                        "as buffer, over the group's ranks in stage-local rank order (docs/MOE.md)";
  plan.metadata["layout"] = lj;
  return plan;
}

std::string Plan::to_string() const {
  std::string s = "plan: " + layout.to_string() + ", world size " + std::to_string(layout.world_size()) + ", " +
                  std::to_string(files.size()) + " shard files, " + std::to_string(pieces.size()) + " pieces of " +
                  std::to_string(tensors.size()) + " tensors\n";
  s += "  source " + human_bytes(source_bytes) + "; read " + human_bytes(bytes_read) + "; write " +
       human_bytes(bytes_written) + "; peak buffer " + human_bytes(peak_buffer) + "\n";
  for (const FileWork& f : files) {
    const RankPlace at = layout.place_of_rank(f.rank);
    char where[96], buf[320];
    if (layout.symmetric())
      std::snprintf(where, sizeof where, "pp %d, dp %d, tp %d", at.stage, at.pipeline, at.tp_rank);
    else
      std::snprintf(where, sizeof where, "pipeline %d, stage %d, tp %d of %d", at.pipeline, at.stage, at.tp_rank,
                    layout.stage_tp(at.pipeline, at.stage));
    std::snprintf(buf, sizeof buf, "  %s  rank %d (%s)  %zu pieces  write %s  read %s\n", f.file.c_str(), f.rank, where,
                  f.pieces.size(), human_bytes(f.bytes_written).c_str(), human_bytes(f.bytes_read).c_str());
    s += buf;
  }
  return s;
}

nlohmann::json Plan::to_json() const {
  nlohmann::json files_j = nlohmann::json::array();
  for (const FileWork& f : files)
    files_j.push_back({{"rank", f.rank},
                       {"file", f.file},
                       {"pieces", f.pieces.size()},
                       {"bytes_written", f.bytes_written},
                       {"bytes_read", f.bytes_read}});
  return {{"layout", layout.to_json()},
          {"tensors", tensors.size()},
          {"pieces", pieces.size()},
          {"source_bytes", source_bytes},
          {"bytes_read", bytes_read},
          {"bytes_written", bytes_written},
          {"peak_buffer", peak_buffer},
          {"files", files_j}};
}

}  // namespace ckpt
