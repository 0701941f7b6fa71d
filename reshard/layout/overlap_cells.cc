#include "reshard/layout/overlap_cells.h"

#include <algorithm>
#include <map>

namespace ckpt {

namespace {

using Index = std::vector<int64_t>;

// Calls f(idx) for every idx with lo[d] <= idx[d] < hi[d], row-major (one call for rank 0).
template <typename F>
void for_each_index(const Index& lo, const Index& hi, F&& f) {
  for (size_t d = 0; d < lo.size(); ++d)
    if (lo[d] >= hi[d]) return;
  Index idx = lo;
  while (true) {
    f(idx);
    size_t d = idx.size();
    while (d > 0) {
      --d;
      if (++idx[d] < hi[d]) break;
      idx[d] = lo[d];
      if (d == 0) return;
    }
    if (idx.empty()) return;
  }
}

int64_t cut_index(const std::vector<int64_t>& cuts, int64_t v) {
  return std::lower_bound(cuts.begin(), cuts.end(), v) - cuts.begin();
}

}  // namespace

OverlapCells cut_overlap_cells(const std::vector<Holding>& hs, const std::vector<size_t>& list) {
  struct Rect {
    int rank;
    Box box;
  };
  std::vector<Rect> rects;
  for (size_t h : list) {
    const Holding& x = hs[h];
    if (x.a == 0 && x.b == x.box.numel()) {
      if (x.box.numel() > 0) rects.push_back({x.rank, x.box});
      continue;
    }
    for (Box& b : flat_range_to_boxes(x.box, x.a, x.b))
      if (b.numel() > 0) rects.push_back({x.rank, std::move(b)});
  }
  OverlapCells out;
  if (rects.empty()) return out;
  const size_t nd = rects[0].box.ndim();
  out.cuts.resize(nd);
  for (const Rect& r : rects)
    for (size_t d = 0; d < nd; ++d) out.cuts[d].insert(out.cuts[d].end(), {r.box.offset[d], r.box.offset[d] + r.box.extent[d]});
  for (auto& c : out.cuts) {
    std::sort(c.begin(), c.end());
    c.erase(std::unique(c.begin(), c.end()), c.end());
  }
  std::map<Index, std::vector<std::pair<int, int>>> acc;  // cell -> (rank, rect id), row-major order
  for (size_t id = 0; id < rects.size(); ++id) {
    Index lo(nd), hi(nd);
    for (size_t d = 0; d < nd; ++d) {
      lo[d] = cut_index(out.cuts[d], rects[id].box.offset[d]);
      hi[d] = cut_index(out.cuts[d], rects[id].box.offset[d] + rects[id].box.extent[d]);
    }
    for_each_index(lo, hi, [&](const Index& idx) { acc[idx].push_back({rects[id].rank, static_cast<int>(id)}); });
  }
  for (auto& [idx, hold] : acc) {
    std::sort(hold.begin(), hold.end());
    OverlapCell c;
    c.grid = idx;
    c.box.offset.resize(nd);
    c.box.extent.resize(nd);
    for (size_t d = 0; d < nd; ++d) {
      c.box.offset[d] = out.cuts[d][static_cast<size_t>(idx[d])];
      c.box.extent[d] = out.cuts[d][static_cast<size_t>(idx[d]) + 1] - c.box.offset[d];
    }
    for (const auto& [rank, id] : hold)
      if (c.holders.empty() || c.holders.back() != rank) {
        c.holders.push_back(rank);
        c.holder_rect.push_back(id);
      }
    out.cells.push_back(std::move(c));
  }
  return out;
}

std::vector<std::pair<int, Box>> merge_cells(const OverlapCells& oc, const std::vector<int>& writer) {
  // The merge key of each cell: (writer, the writer's rectangle).
  std::map<Index, size_t> at;
  std::vector<std::pair<int, int>> key(oc.cells.size());
  for (size_t k = 0; k < oc.cells.size(); ++k) {
    const OverlapCell& c = oc.cells[k];
    at[c.grid] = k;
    const size_t h = static_cast<size_t>(std::find(c.holders.begin(), c.holders.end(), writer[k]) - c.holders.begin());
    key[k] = {writer[k], h < c.holder_rect.size() ? c.holder_rect[h] : -1};
  }
  std::vector<bool> done(oc.cells.size(), false);
  std::vector<std::pair<int, Box>> out;
  const size_t nd = oc.cuts.size();
  for (size_t k = 0; k < oc.cells.size(); ++k) {
    if (done[k]) continue;
    Index lo = oc.cells[k].grid, hi = lo;
    for (auto& v : hi) ++v;
    // Grow along each dimension, last first, while the next slab is all free cells of this key.
    for (size_t d = nd; d-- > 0;) {
      while (hi[d] + 1 < static_cast<int64_t>(oc.cuts[d].size())) {
        Index slo = lo, shi = hi;
        slo[d] = hi[d];
        shi[d] = hi[d] + 1;
        bool ok = true;
        for_each_index(slo, shi, [&](const Index& idx) {
          auto it = at.find(idx);
          ok = ok && it != at.end() && !done[it->second] && key[it->second] == key[k];
        });
        if (!ok) break;
        ++hi[d];
      }
    }
    for_each_index(lo, hi, [&](const Index& idx) { done[at.at(idx)] = true; });
    Box b;
    b.offset.resize(nd);
    b.extent.resize(nd);
    for (size_t d = 0; d < nd; ++d) {
      b.offset[d] = oc.cuts[d][static_cast<size_t>(lo[d])];
      b.extent[d] = oc.cuts[d][static_cast<size_t>(hi[d])] - b.offset[d];
    }
    out.push_back({writer[k], std::move(b)});
  }
  return out;
}

}  // namespace ckpt
