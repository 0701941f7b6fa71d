// Stage splits (trainer/plan/stage_split.h).
#include "trainer/plan/stage_split.h"

#include <algorithm>

namespace ckpt::trainer {

SplitResult min_max_split(int num_layers, int stages, const StageCostFn& time) {
  SplitResult r;
  if (stages < 1 || num_layers < stages) return r;
  const size_t L = static_cast<size_t>(num_layers), S = static_cast<size_t>(stages);
  // Costs cached: cost[k][n] for stage k holding n layers.
  std::vector<std::vector<double>> cost(S, std::vector<double>(L + 1, kInfeasible));
  for (size_t k = 0; k < S; ++k)
    for (size_t n = 1; n + (S - 1) <= L; ++n) cost[k][n] = time(static_cast<int>(k), static_cast<int>(n));
  std::vector<std::vector<double>> best(S + 1, std::vector<double>(L + 1, kInfeasible));
  std::vector<std::vector<size_t>> from(S + 1, std::vector<size_t>(L + 1, 0));
  best[0][0] = 0;
  for (size_t k = 1; k <= S; ++k)
    for (size_t j = k; j + (S - k) <= L; ++j)
      for (size_t i = k - 1; i < j; ++i) {
        const double v = std::max(best[k - 1][i], cost[k - 1][j - i]);
        if (v < best[k][j]) best[k][j] = v, from[k][j] = i;  // ties: the earliest cut (fewer layers in front)
      }
  if (!(best[S][L] < kInfeasible)) return r;
  r.ok = true;
  r.max_time = best[S][L];
  r.layers.assign(S, 0);
  for (size_t k = S, j = L; k > 0; --k) {
    r.layers[k - 1] = static_cast<int>(j - from[k][j]);
    j = from[k][j];
  }
  r.value = r.max_time;
  return r;
}

SplitResult best_split(int num_layers, int stages, double k, const StageCostFn& time, const StageCostFn& sync) {
  SplitResult best;
  if (stages < 1 || num_layers < stages) return best;
  std::vector<double> thetas;
  for (int s = 0; s < stages; ++s)
    for (int n = 1; n + stages - 1 <= num_layers; ++n) thetas.push_back(sync(s, n));
  std::sort(thetas.begin(), thetas.end());
  thetas.erase(std::unique(thetas.begin(), thetas.end()), thetas.end());
  double theta = thetas.empty() ? 0 : thetas.back();
  while (true) {
    const double limit = theta;
    SplitResult r = min_max_split(num_layers, stages, [&](int s, int n) { return sync(s, n) <= limit ? time(s, n) : kInfeasible; });
    if (!r.ok) break;  // a lower theta only removes stages
    r.max_sync = 0;
    for (int s = 0; s < stages; ++s) r.max_sync = std::max(r.max_sync, sync(s, r.layers[static_cast<size_t>(s)]));
    r.value = k * r.max_time + r.max_sync;
    if (r.value < best.value) best = r;
    if (k * r.max_time >= best.value) break;  // bound: every lower theta costs at least k * r.max_time
    // Next theta: the largest sync value below this split's largest.
    auto it = std::lower_bound(thetas.begin(), thetas.end(), r.max_sync);
    if (it == thetas.begin()) break;
    theta = *(it - 1);
  }
  return best;
}

}  // namespace ckpt::trainer
