#include "reshard/zero_layout.h"

#include <algorithm>

#include "formats/checked.h"

namespace ckpt {

namespace {

Status overflow(const std::string& kind) {
  return Status::Error("ZeroBufferOverflow", "ZeRO buffer size overflows (" + kind + ")");
}

bool on_stage(const TensorPlacement& pl, int stage) {
  return std::find(pl.stages.begin(), pl.stages.end(), stage) != pl.stages.end();
}

// The buffer of (stage, tp_rank, kind) over tensors whose kind is kind_of[i] (empty: not an
// optimizer tensor).
Result<ZeroBuffer> one_buffer(const std::vector<TensorPlacement>& pls, const std::vector<std::string>& kind_of,
                              const Layout& layout, int stage, int tp_rank, const std::string& kind) {
  ZeroBuffer zb;
  zb.stage = stage;
  zb.tp_rank = tp_rank;
  zb.kind = kind;
  zb.dp = layout.dp;
  for (size_t i = 0; i < pls.size(); ++i) {
    if (kind_of[i].empty() || kind_of[i] != kind || !on_stage(pls[i], stage)) continue;
    const Box& box = pls[i].tp_boxes[static_cast<size_t>(tp_rank)];
    const int64_t n = box.numel();
    zb.segments.push_back({i, box, zb.total, n});
    auto nt = checked_add(zb.total, n);
    if (!nt) return overflow(kind);
    zb.total = *nt;
  }
  auto pad = checked_mul(kZeroPadElements, static_cast<int64_t>(layout.dp));
  auto up = pad ? checked_add(zb.total, *pad - 1) : std::nullopt;
  if (!up) return overflow(kind);
  zb.padded = *up / *pad * *pad;
  return zb;
}

}  // namespace

std::string zero_kind(const std::string& name) {
  size_t p = name.find('.');
  if (p == std::string::npos) return name;
  size_t q = name.find('.', p + 1);
  return q == std::string::npos ? name : name.substr(0, q);
}

Result<std::vector<ZeroBuffer>> zero_buffers(const std::vector<TensorMeta>& tensors,
                                             const std::vector<TensorPlacement>& placements,
                                             const Layout& layout) {
  std::vector<std::string> kinds;
  std::vector<std::string> kind_of(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!placements[i].optimizer_state) continue;
    kind_of[i] = zero_kind(tensors[i].name);
    if (std::find(kinds.begin(), kinds.end(), kind_of[i]) == kinds.end()) kinds.push_back(kind_of[i]);
  }
  std::vector<ZeroBuffer> out;
  for (int s = 0; s < layout.pp; ++s)
    for (int t = 0; t < layout.tp; ++t)
      for (const std::string& kind : kinds) {
        CKPT_ASSIGN_OR_RETURN(ZeroBuffer zb, one_buffer(placements, kind_of, layout, s, t, kind));
        if (zb.total > 0) out.push_back(std::move(zb));
      }
  return out;
}

Result<ZeroBuffer> zero_buffer(const std::vector<TensorMeta>& tensors, const Layout& layout,
                               const ShardingRules& rules, int stage, int tp_rank, const std::string& kind) {
  if (tp_rank < 0 || tp_rank >= layout.tp || stage < 0 || stage >= layout.pp || layout.dp < 1)
    return Status::InvalidArgument("ZeRO buffer of stage " + std::to_string(stage) + ", tp rank " +
                                   std::to_string(tp_rank) + " outside " + layout.to_string());
  std::vector<TensorPlacement> pls(tensors.size());
  std::vector<std::string> kind_of(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (zero_kind(tensors[i].name) != kind) continue;
    auto p = rules.place(tensors[i], layout);
    if (!p.ok()) return p.take_status().with_tensor(tensors[i].name);
    pls[i] = std::move(p).value();
    if (!pls[i].optimizer_state) continue;
    if (pls[i].tp_boxes.size() != static_cast<size_t>(layout.tp))
      return Status::Internal("sharding rules gave " + std::to_string(pls[i].tp_boxes.size()) + " TP boxes for '" +
                              tensors[i].name + "' under tp=" + std::to_string(layout.tp))
          .with_tensor(tensors[i].name);
    kind_of[i] = kind;
  }
  return one_buffer(pls, kind_of, layout, stage, tp_rank, kind);
}

}  // namespace ckpt
