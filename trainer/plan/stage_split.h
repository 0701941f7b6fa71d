// Stage splits for the planner (docs/PLAN.md "Stage split"): L identical decoder layers into S
// contiguous non-empty stages. A stage's cost depends on its index (its devices, whether it holds
// the embedding or the head) and its number of layers only.
// - min_max_split: minimizes the largest stage time by dynamic programming,
//   best[k][j] = min over i < j of max(best[k-1][i], time(k-1, j - i)), O(S L^2) evaluations;
// - best_split: minimizes sum_s time(s, n_s) + K * max_s time(s, n_s) + max_s sync(s, n_s) (the
//   pipeline's time under 1F1B: one micro-batch through every stage, K = m - 1 more at the slowest
//   stage's pace, plus the largest stage's gradient sync; docs/PLAN.md "Pipeline time"). Exact:
//   for every sync cap theta (stages with sync > theta excluded; from the largest value down) and
//   every cap c on the stage time (the stage-time values from the min-max optimum up to the uncapped
//   min-sum split's largest), the min-sum
//   DP under both caps; each split found is valued exactly. Admissible bounds stop both loops:
//   under caps >= c the value is at least minsum + K c, at a lower theta at least
//   minsum + K minmax (the uncapped min-sum and min-max at theta only grow as theta falls).
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
  double max_time = kInfeasible, sum_time = kInfeasible, max_sync = 0, value = kInfeasible;
};

using StageCostFn = std::function<double(int stage, int layers)>;

SplitResult min_max_split(int num_layers, int stages, const StageCostFn& time);
// cutoff: only splits valued below it are looked for (none: ok false); the bounds above then stop
// both loops early (the search passes the K-th best step time found).
SplitResult best_split(int num_layers, int stages, double k, const StageCostFn& time, const StageCostFn& sync,
                       double cutoff = kInfeasible);

}  // namespace ckpt::trainer
