// hand_written_layout and why_slower (trainer/plan/search.h).
#include <algorithm>
#include <cstdio>
#include <numeric>

#include "trainer/plan/search.h"
#include "trainer/plan/search_space.h"

namespace ckpt::trainer {

Result<PlanCandidate> hand_written_layout(const ModelSpec& model, const Cluster& cluster, const SearchOptions& opt) {
  const std::vector<int> types = search_detail::used_types(cluster);
  auto choices = search_detail::tp_choices(model, cluster, types, false);
  std::vector<int> tp_of;
  for (const auto& c : choices) tp_of.push_back(c.empty() ? 1 : c.back());
  const auto g = search_detail::make_groups(cluster, types, tp_of, false);
  // Types in the cluster's rank order; P pipelines of equal composition, the fewest stages first.
  std::vector<int> order;
  for (int r = 0; r < cluster.world_size(); ++r)
    if (std::find(order.begin(), order.end(), cluster.rank_type[static_cast<size_t>(r)]) == order.end())
      order.push_back(cluster.rank_type[static_cast<size_t>(r)]);
  int common = 0;
  for (int t : order) {
    int n = 0;
    for (const auto& x : g) n += x.type == t ? 1 : 0;
    common = std::gcd(common, n);
  }
  Result<PlanCandidate> last = Status::Error("PlanInfeasible", "no hand-written layout: the model has fewer layers than the stages");
  for (int P = common; P >= 1; --P) {
    if (common % P || opt.global_batch % P) continue;
    std::vector<PipelineSpec> pls(static_cast<size_t>(P));
    std::vector<std::vector<int>> ranks(static_cast<size_t>(P));
    for (int t : order) {
      std::vector<const search_detail::TpGroup*> of;
      for (const auto& x : g)
        if (x.type == t) of.push_back(&x);
      const size_t k = of.size() / static_cast<size_t>(P);
      for (size_t p = 0; p < static_cast<size_t>(P); ++p)
        for (size_t i = 0; i < k; ++i) {
          const auto* grp = of[p * k + i];
          pls[p].stages.push_back({0, grp->tp, cluster.types[static_cast<size_t>(t)].name});
          ranks[p].insert(ranks[p].end(), grp->ranks.begin(), grp->ranks.end());
        }
    }
    const int S = static_cast<int>(pls[0].stages.size());
    if (S > model.layers) continue;
    for (auto& pl : pls)
      for (int s = 0; s < S; ++s)
        pl.stages[static_cast<size_t>(s)].layers = static_cast<int>(model.layers / S + (s < model.layers % S ? 1 : 0));
    PlanCandidate c;
    CKPT_ASSIGN_OR_RETURN(c.layout, Layout::from_pipelines(pls, 0));
    c.placement.assign(static_cast<size_t>(c.layout.world_size()), -1);
    const std::vector<std::vector<int>> first = layout_first_ranks(c.layout);
    for (int p = 0; p < P; ++p) {
      size_t k = 0;
      for (int s = 0; s < S; ++s)
        for (int j = 0; j < c.layout.stage_tp(p, s); ++j)
          c.placement[static_cast<size_t>(first[static_cast<size_t>(p)][static_cast<size_t>(s)] + j)] = ranks[static_cast<size_t>(p)][k++];
    }
    CKPT_ASSIGN_OR_RETURN(c.cost, evaluate(model, cluster, c.layout, plan_options_of(opt, c.placement)));
    if (c.cost.feasible) return c;
    // MoE: the smallest ep (etp 1, Megatron's usual choice) whose experts fit, on the symmetric form.
    const int tp0 = pls[0].stages[0].tp;
    bool one_tp = true;
    for (const auto& st : pls[0].stages) one_tp = one_tp && st.tp == tp0;
    for (const auto& [ep, etp] : one_tp ? search_detail::ep_choices(model, tp0, P) : std::vector<std::pair<int, int>>{}) {
      auto sym = c.layout.as_symmetric("expert parallelism");
      if (etp != 1 || !sym.ok()) continue;
      PlanCandidate e = c;
      e.layout = std::move(sym).value();
      e.layout.ep = ep, e.layout.etp = etp;
      CKPT_ASSIGN_OR_RETURN(e.cost, evaluate(model, cluster, e.layout, plan_options_of(opt, e.placement)));
      if (e.cost.feasible) return e;
    }
    if (!last.ok()) last = std::move(c);
  }
  return last;
}

std::string why_slower(const PlanCandidate& c, const PlanCandidate& best) {
  char buf[512];
  auto worst = [](const PlanCost& k) {
    const StageCost* w = nullptr;
    for (const StageCost& s : k.stages)
      if (!w || s.time_s() > w->time_s()) w = &s;
    return w;
  };
  const StageCost* a = worst(c.cost);
  const StageCost* b = worst(best.cost);
  double bubble_c = 0, bubble_b = 0, sync_c = 0, sync_b = 0;
  for (const auto& p : c.cost.pipelines) bubble_c = std::max(bubble_c, p.bubble_s), sync_c = std::max(sync_c, p.dp_sync_s);
  for (const auto& p : best.cost.pipelines) bubble_b = std::max(bubble_b, p.bubble_s), sync_b = std::max(sync_b, p.dp_sync_s);
  std::snprintf(buf, sizeof buf,
                "%.1f%% slower: bottleneck pipeline %d stage %d (%d layers, tp %d on %s) %.4g s per micro-batch "
                "(compute %.3g, tp %.3g, p2p %.3g) vs %.4g s; bubble %.4g s vs %.4g s; dp sync %.4g s vs %.4g s",
                100 * (c.cost.step_time_s / best.cost.step_time_s - 1), a->pipeline, a->stage, a->layers, a->tp, a->device.c_str(),
                a->time_s(), a->compute_s, a->tp_comm_s, a->p2p_s, b->time_s(), bubble_c, bubble_b, sync_c, sync_b);
  return buf;
}

}  // namespace ckpt::trainer
