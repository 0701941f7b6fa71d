#include "reshard/layout/zero_layout.h"

#include <algorithm>

#include "formats/base/checked.h"

namespace ckpt {

namespace {

Status overflow(const std::string& kind) {
  return Status::Error("ZeroBufferOverflow", "ZeRO buffer size overflows (" + kind + ")");
}

// The buffer of (stage, tp_rank, kind) over tensors whose kind is kind_of[i] (empty: not an
// optimizer tensor) and whose TP boxes on the stage are *boxes[i] (null: not on the stage).
Result<ZeroBuffer> one_buffer(const std::vector<const std::vector<Box>*>& boxes,
                              const std::vector<std::string>& kind_of, int dp, int stage, int tp_rank,
                              const std::string& kind) {
  ZeroBuffer zb;
  zb.stage = stage;
  zb.tp_rank = tp_rank;
  zb.kind = kind;
  zb.dp = dp;
  for (size_t i = 0; i < boxes.size(); ++i) {
    if (kind_of[i].empty() || kind_of[i] != kind || !boxes[i]) continue;
    const Box& box = (*boxes[i])[static_cast<size_t>(tp_rank)];
    const int64_t n = box.numel();
    zb.segments.push_back({i, box, zb.total, n});
    auto nt = checked_add(zb.total, n);
    if (!nt) return overflow(kind);
    zb.total = *nt;
  }
  auto pad = checked_mul(kZeroPadElements, static_cast<int64_t>(dp));
  auto up = pad ? checked_add(zb.total, *pad - 1) : std::nullopt;
  if (!up) return overflow(kind);
  zb.padded = *up / *pad * *pad;
  return zb;
}

// The expert buffers of stage `s` (see zero_buffers): the ranks (pipeline, tp rank) grouped by the
// boxes they hold of every expert optimizer tensor on the stage.
Status expert_buffers(const std::vector<std::vector<StagePlacement>>& placed, const std::vector<std::string>& kind_of,
                      const std::vector<std::string>& kinds, const Layout& layout, int s, std::vector<ZeroBuffer>& out) {
  std::vector<size_t> on_stage;
  std::vector<std::vector<const StagePlacement*>> by_pipeline(placed.size());
  for (size_t i = 0; i < placed.size(); ++i) {
    if (kind_of[i].empty()) continue;
    by_pipeline[i].assign(static_cast<size_t>(layout.num_pipelines()), nullptr);
    for (const StagePlacement& sp : placed[i])
      if (sp.stage == s) by_pipeline[i][static_cast<size_t>(sp.pipeline)] = &sp;
    if (by_pipeline[i][0]) on_stage.push_back(i);
  }
  if (on_stage.empty()) return Status::Ok();
  const int tp = layout.stage_tp(0, s);
  std::vector<std::vector<std::pair<int, int>>> groups;  // members, in stage-local rank order
  std::vector<std::vector<Box>> keys;                    // the boxes every member of a group holds
  for (int p = 0; p < layout.num_pipelines(); ++p)
    for (int t = 0; t < tp; ++t) {
      std::vector<Box> key;
      for (size_t i : on_stage) key.push_back(by_pipeline[i][static_cast<size_t>(p)]->tp_boxes[static_cast<size_t>(t)]);
      auto it = std::find(keys.begin(), keys.end(), key);
      if (it == keys.end()) {
        keys.push_back(std::move(key));
        groups.push_back({{p, t}});
      } else {
        groups[static_cast<size_t>(it - keys.begin())].push_back({p, t});
      }
    }
  for (const auto& members : groups) {
    std::vector<const std::vector<Box>*> boxes(placed.size(), nullptr);
    for (size_t i : on_stage) boxes[i] = &by_pipeline[i][static_cast<size_t>(members[0].first)]->tp_boxes;
    for (const std::string& kind : kinds) {
      CKPT_ASSIGN_OR_RETURN(ZeroBuffer zb, one_buffer(boxes, kind_of, static_cast<int>(members.size()), s,
                                                      members[0].second, kind));
      zb.members = members;
      if (zb.total > 0) out.push_back(std::move(zb));
    }
  }
  return Status::Ok();
}

}  // namespace

std::string zero_kind(const std::string& name) {
  size_t p = name.find('.');
  if (p == std::string::npos) return name;
  size_t q = name.find('.', p + 1);
  return q == std::string::npos ? name : name.substr(0, q);
}

Result<std::vector<ZeroBuffer>> zero_buffers(const std::vector<TensorMeta>& tensors,
                                             const std::vector<std::vector<StagePlacement>>& placed,
                                             const Layout& layout) {
  if (!layout.uniform_pipelines())
    return Status::Unsupported("ZeRO-1 flat buffers need every pipeline to hold the same layers at the same tp on "
                               "each stage: " + layout.to_string());
  std::vector<std::string> kinds;
  std::vector<std::string> kind_of(tensors.size()), expert_kind_of(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (placed[i].empty() || !placed[i].front().optimizer_state) continue;
    (placed[i].front().expert ? expert_kind_of : kind_of)[i] = zero_kind(tensors[i].name);
    const std::string& k = zero_kind(tensors[i].name);
    if (std::find(kinds.begin(), kinds.end(), k) == kinds.end()) kinds.push_back(k);
  }
  std::vector<ZeroBuffer> out;
  std::vector<const std::vector<Box>*> boxes(tensors.size());
  for (int s = 0; s < layout.num_stages(0); ++s) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      boxes[i] = nullptr;
      for (const StagePlacement& sp : placed[i])
        if (sp.pipeline == 0 && sp.stage == s) boxes[i] = &sp.tp_boxes;
    }
    for (int t = 0; t < layout.stage_tp(0, s); ++t)
      for (const std::string& kind : kinds) {
        CKPT_ASSIGN_OR_RETURN(ZeroBuffer zb, one_buffer(boxes, kind_of, layout.num_pipelines(), s, t, kind));
        if (zb.total > 0) out.push_back(std::move(zb));
      }
    CKPT_RETURN_IF_ERROR(expert_buffers(placed, expert_kind_of, kinds, layout, s, out));
  }
  return out;
}

Result<ZeroBuffer> zero_buffer(const std::vector<TensorMeta>& tensors, const Layout& layout_in,
                               const ShardingRules& rules, int stage, int tp_rank, const std::string& kind) {
  const bool general = !layout_in.symmetric();
  if (general && (!layout_in.uniform_pipelines() || stage < 0 || stage >= layout_in.num_stages(0)))
    return Status::InvalidArgument("ZeRO buffer of stage " + std::to_string(stage) + " of " + layout_in.to_string() +
                                   " (ZeRO-1 needs uniform pipelines)");
  const Layout layout = general ? layout_in.stage_view(0, stage) : layout_in;
  if (tp_rank < 0 || tp_rank >= layout.tp || stage < 0 || stage >= layout.pp || layout.dp < 1)
    return Status::InvalidArgument("ZeRO buffer of stage " + std::to_string(stage) + ", tp rank " +
                                   std::to_string(tp_rank) + " outside " + layout.to_string());
  std::vector<TensorPlacement> pls(tensors.size());
  std::vector<std::string> kind_of(tensors.size());
  std::vector<const std::vector<Box>*> boxes(tensors.size(), nullptr);
  Layout asked = layout;  // expert tensors' boxes need a DP rank; this dense buffer leaves them out anyway
  if (asked.view_pipeline < 0) asked.view_pipeline = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (zero_kind(tensors[i].name) != kind) continue;
    auto p = rules.place(tensors[i], asked);
    if (!p.ok()) return p.take_status().with_tensor(tensors[i].name);
    pls[i] = std::move(p).value();
    if (!pls[i].optimizer_state || pls[i].expert) continue;  // experts of an EP layout: zero_buffers' expert buffers
    if (pls[i].tp_boxes.size() != static_cast<size_t>(layout.tp))
      return Status::Internal("sharding rules gave " + std::to_string(pls[i].tp_boxes.size()) + " TP boxes for '" +
                              tensors[i].name + "' under tp=" + std::to_string(layout.tp))
          .with_tensor(tensors[i].name);
    kind_of[i] = kind;
    if (std::find(pls[i].stages.begin(), pls[i].stages.end(), stage) != pls[i].stages.end())
      boxes[i] = &pls[i].tp_boxes;
  }
  return one_buffer(boxes, kind_of, layout.dp, stage, tp_rank, kind);
}

}  // namespace ckpt
