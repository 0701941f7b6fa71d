// Stage splits for the planner (docs/PLAN.md "Stage split"): L identical decoder layers into S
// contiguous non-empty stages. A stage's cost depends on its index (its devices, whether it holds
// the embedding or the head) and its number of layers only.
// - min_max_split: minimizes the largest stage time by dynamic programming,
//   best[k][j] = min over i < j of max(best[k-1][i], time(k-1, j - i)), O(S L^2) evaluations;
// - best_split: minimizes K * max_s time(s, n_s) + max_s sync(s, n_s) (the pipeline's time:
//   K = m + S - 1 bubbled micro-batch slots plus the largest stage's gradient sync): the min-max
//   DP restricted to stages with sync <= theta, for theta over the sync values from the largest
//   down; it stops when K * (the restricted optimum) alone reaches the best total, an admissible
//   bound because the restricted optimum only grows as theta falls (exact).
// An infeasible stage (memory) has time +inf. Pure functions; thread safe.
#pragma once

#include <functional>
#include <limits>
#include <vector>

namespace ckpt::trainer {

inline constexpr double kInfeasible = std::numeric_limits<double>::infinity();

struct SplitResult {
  bool ok = false;              // some split has every stage feasible
  std::vector<int> layers;      // per stage
  double max_time = kInfeasible, max_sync = 0, value = kInfeasible;
};

using StageCostFn = std::function<double(int stage, int layers)>;

SplitResult min_max_split(int num_layers, int stages, const StageCostFn& time);
SplitResult best_split(int num_layers, int stages, double k, const StageCostFn& time, const StageCostFn& sync);

}  // namespace ckpt::trainer
