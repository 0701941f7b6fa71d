#include "reshard/layout/tensor_placement.h"

#include <algorithm>

namespace ckpt {

namespace {

Status bad_stage_placement(const TensorMeta& t, const std::string& msg) {
  return Status::Internal("sharding rules gave a bad placement for '" + t.name + "': " + msg).with_tensor(t.name);
}

}  // namespace

Result<std::vector<StagePlacement>> place_in_layout(const TensorMeta& t, const Layout& layout,
                                                    const ShardingRules& rules) {
  std::vector<StagePlacement> out;
  for (int p = 0; p < layout.num_pipelines(); ++p) {
    // Which stages hold the tensor does not depend on tp, ep or etp: ask stage 0's view, then each
    // holding stage's own view for its boxes. Expert tensors' boxes depend on the view's DP rank
    // (Layout::expert_parallel): the pipeline, or 0 in a view of non-uniform pipelines (dp 1).
    Layout v0 = layout.stage_view(p, 0);
    const int view_dp_rank = v0.dp == 1 ? 0 : p;
    v0.view_pipeline = view_dp_rank;
    auto first = rules.place(t, v0);
    if (!first.ok()) return first.take_status().with_tensor(t.name);
    std::vector<int> stages = first->stages;
    std::sort(stages.begin(), stages.end());
    stages.erase(std::unique(stages.begin(), stages.end()), stages.end());
    if (stages.empty()) return bad_stage_placement(t, "no pipeline stage");
    for (int s : stages) {
      if (s < 0 || s >= layout.num_stages(p))
        return bad_stage_placement(t, "stage " + std::to_string(s) + " outside 0.." + std::to_string(layout.num_stages(p) - 1));
      TensorPlacement pl;
      if (layout.stage_tp(p, s) == v0.tp && layout.stage_ep(p, s) == v0.ep &&
          layout.stage_expert_tp(p, s) == v0.expert_tp()) {
        pl = *first;
      } else {
        Layout vs = layout.stage_view(p, s);
        vs.view_pipeline = view_dp_rank;
        auto r = rules.place(t, vs);
        if (!r.ok()) return r.take_status().with_tensor(t.name);
        pl = std::move(r).value();
      }
      if (static_cast<int>(pl.tp_boxes.size()) != layout.stage_tp(p, s))
        return bad_stage_placement(t, std::to_string(pl.tp_boxes.size()) + " TP boxes for tp=" +
                                    std::to_string(layout.stage_tp(p, s)));
      for (const Box& b : pl.tp_boxes) {
        Status st = validate_box(b, t.shape);
        if (!st.ok()) return bad_stage_placement(t, st.message());
      }
      out.push_back({p, s, std::move(pl.tp_boxes), pl.optimizer_state, pl.expert});
    }
    if (layout.symmetric() && !layout.expert_parallel()) {
      // Every pipeline of the symmetric form is placed alike: copy pipeline 0's.
      const size_t n = out.size();
      for (int q = 1; q < layout.num_pipelines(); ++q)
        for (size_t k = 0; k < n; ++k) {
          out.push_back(out[k]);
          out.back().pipeline = q;
        }
      std::stable_sort(out.begin(), out.end(),
                       [](const StagePlacement& a, const StagePlacement& b) { return a.pipeline < b.pipeline; });
      break;
    }
  }
  return out;
}

Status check_layout_views(const Layout& layout, const ShardingRules& rules) {
  if (layout.symmetric()) return rules.check_layout(layout);
  for (int p = 0; p < layout.num_pipelines(); ++p)
    for (int s = 0; s < layout.num_stages(p); ++s) {
      Status st = rules.check_layout(layout.stage_view(p, s));
      if (!st.ok())
        return Status::Error(st.code(), "pipeline " + std::to_string(p) + " stage " + std::to_string(s) + " (" +
                                            layout.to_string() + "): " + st.message());
    }
  return Status::Ok();
}

}  // namespace ckpt
