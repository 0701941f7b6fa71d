#include "reshard/layout/holdings.h"

#include <algorithm>
#include <cstring>

#include "reshard/layout/tensor_placement.h"
#include "reshard/layout/zero_layout.h"

namespace ckpt {

Result<std::vector<Holding>> layout_holdings(const std::vector<TensorMeta>& tensors, const Layout& layout,
                                             const ShardingRules& rules, int only_rank) {
  std::vector<std::vector<StagePlacement>> placed(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    CKPT_ASSIGN_OR_RETURN(placed[i], place_in_layout(tensors[i], layout, rules));
  }
  std::vector<Holding> out;
  const bool zero = layout.zero == 1;
  // Unsharded tensors (and everything under zero 0).
  for (size_t i = 0; i < tensors.size(); ++i)
    for (const StagePlacement& sp : placed[i]) {
      if (zero && sp.optimizer_state) continue;
      for (size_t t = 0; t < sp.tp_boxes.size(); ++t) {
        const Box& b = sp.tp_boxes[t];
        const int r = layout.rank_of(sp.stage, sp.pipeline, static_cast<int>(t));
        if (b.numel() == 0 || (only_rank >= 0 && r != only_rank)) continue;
        out.push_back({i, r, b, 0, b.numel()});
      }
    }
  if (!zero) return out;
  // ZeRO-1: the flat buffers of reshard/layout/zero_layout.h, each DP rank's range cut into its segments.
  CKPT_ASSIGN_OR_RETURN(std::vector<ZeroBuffer> bufs, zero_buffers(tensors, placed, layout));
  for (const ZeroBuffer& zb : bufs) {
    const auto& segs = zb.segments;
    size_t k = 0;  // first segment that may intersect the shard
    for (int d = 0; d < zb.dp; ++d) {
      const auto [lo, hi] = zb.range(d);
      const auto [pipeline, tp_rank] = zb.holder(d);
      const int r = layout.rank_of(zb.stage, pipeline, tp_rank);
      while (k < segs.size() && segs[k].offset + segs[k].numel <= lo) ++k;
      for (size_t j = k; j < segs.size() && segs[j].offset < hi; ++j) {
        const int64_t a = std::max(lo, segs[j].offset) - segs[j].offset;
        const int64_t b = std::min(hi, segs[j].offset + segs[j].numel) - segs[j].offset;
        if (a >= b || (only_rank >= 0 && r != only_rank)) continue;
        out.push_back({segs[j].tensor, r, segs[j].box, a, b});
      }
    }
  }
  return out;
}

bool copy_from_held(const Region& held, const void* held_data, const Region& piece, void* out, size_t elem_size) {
  if (held.box == piece.box) {  // a flat range of the same box: one run
    const int64_t ha = held.is_flat() ? held.flat_begin : 0, hz = held.is_flat() ? held.flat_end : held.box.numel();
    const int64_t pa = piece.is_flat() ? piece.flat_begin : 0, pz = piece.is_flat() ? piece.flat_end : piece.box.numel();
    if (pa >= ha && pz <= hz) {
      std::memcpy(out, static_cast<const uint8_t*>(held_data) + (pa - ha) * static_cast<int64_t>(elem_size),
                  static_cast<size_t>(pz - pa) * elem_size);
      return true;
    }
  }
  const std::vector<Box> hb = held.boxes(), pb = piece.boxes();
  std::vector<int64_t> hoff(hb.size(), 0);  // first element of each held rectangle in held_data
  for (size_t k = 1; k < hb.size(); ++k) hoff[k] = hoff[k - 1] + hb[k - 1].numel();
  std::vector<size_t> from(pb.size());
  for (size_t j = 0; j < pb.size(); ++j) {
    from[j] = hb.size();
    for (size_t k = 0; k < hb.size() && from[j] == hb.size(); ++k)
      if (hb[k].ndim() == pb[j].ndim() && hb[k].contains(pb[j])) from[j] = k;
    if (from[j] == hb.size() && pb[j].numel() > 0) return false;
  }
  const auto* src = static_cast<const uint8_t*>(held_data);
  auto* dst = static_cast<uint8_t*>(out);
  int64_t at = 0;
  for (size_t j = 0; j < pb.size(); ++j) {
    if (pb[j].numel() == 0) continue;
    const size_t k = from[j];
    copy_box(src + hoff[k] * static_cast<int64_t>(elem_size), hb[k], dst + at * static_cast<int64_t>(elem_size), pb[j],
             pb[j], elem_size);
    at += pb[j].numel();
  }
  return true;
}

}  // namespace ckpt
