// Stage splits (trainer/plan/stage_split.h).
#include "trainer/plan/stage_split.h"

#include <algorithm>

namespace ckpt::trainer {

namespace split_detail {

using Table = std::vector<std::vector<double>>;  // [stage][layers], kInfeasible outside 1..L-S+1

Table split_table(int num_layers, int stages, const StageCostFn& f) {
  const size_t L = static_cast<size_t>(num_layers), S = static_cast<size_t>(stages);
  Table t(S, std::vector<double>(L + 1, kInfeasible));
  for (size_t k = 0; k < S; ++k)
    for (size_t n = 1; n + (S - 1) <= L; ++n) t[k][n] = f(static_cast<int>(k), static_cast<int>(n));
  return t;
}

// DP over contiguous splits: best[k][j] = min over i < j of combine(best[k-1][i], cost[k-1][j-i]),
// stages whose cost exceeds `cap` excluded. combine = max (min-max) or + (min-sum).
template <class Combine>
SplitResult split_dp(const Table& cost, int num_layers, double cap, Combine combine) {
  SplitResult r;
  const size_t L = static_cast<size_t>(num_layers), S = cost.size();
  const size_t W = L + 1;  // row width of the flat [stage][layers] tables
  std::vector<double> best((S + 1) * W, kInfeasible);
  std::vector<size_t> from((S + 1) * W, 0);
  best[0] = 0;
  for (size_t k = 1; k <= S; ++k) {
    const double* prev = &best[(k - 1) * W];
    const std::vector<double>& row = cost[k - 1];
    for (size_t j = k; j + (S - k) <= L; ++j) {
      double& out = best[k * W + j];
      for (size_t i = k - 1; i < j; ++i) {
        const double c = row[j - i];
        if (!(c <= cap) || !(prev[i] < kInfeasible)) continue;
        const double v = combine(prev[i], c);
        if (v < out) out = v, from[k * W + j] = i;  // ties: the earliest cut (fewer layers in front)
      }
    }
  }
  if (!(best[S * W + L] < kInfeasible)) return r;
  r.ok = true;
  r.layers.assign(S, 0);
  for (size_t k = S, j = L; k > 0; --k) {
    r.layers[k - 1] = static_cast<int>(j - from[k * W + j]);
    j = from[k * W + j];
  }
  r.max_time = 0;
  r.sum_time = 0;
  for (size_t k = 0; k < S; ++k) {
    r.max_time = std::max(r.max_time, cost[k][static_cast<size_t>(r.layers[k])]);
    r.sum_time += cost[k][static_cast<size_t>(r.layers[k])];
  }
  return r;
}

// Function objects (not function pointers): the DP's inner loop inlines them.
struct SplitMax {
  double operator()(double a, double b) const { return std::max(a, b); }
};
struct SplitSum {
  double operator()(double a, double b) const { return a + b; }
};
inline constexpr SplitMax split_max{};
inline constexpr SplitSum split_sum{};

}  // namespace split_detail

SplitResult min_max_split(int num_layers, int stages, const StageCostFn& time) {
  if (stages < 1 || num_layers < stages) return SplitResult{};
  SplitResult r = split_detail::split_dp(split_detail::split_table(num_layers, stages, time), num_layers, kInfeasible,
                                         split_detail::split_max);
  r.value = r.max_time;
  return r;
}

// See stage_split.h: for every sync cap theta (largest first) the splits that minimize the sum of
// stage times under a cap c on every stage time, for c over the stage-time values from the min-max
// optimum up; the value of each is evaluated exactly. Bounds (admissible): under a cap c' >= c the
// value is at least minsum + k c (minsum: the uncapped minimum sum at this theta), and at any lower
// theta at least minsum + k minmax (both only grow as theta falls).
SplitResult best_split(int num_layers, int stages, double k, const StageCostFn& time, const StageCostFn& sync, double cutoff) {
  using namespace split_detail;
  SplitResult best;
  if (stages < 1 || num_layers < stages) return best;
  best.value = cutoff;
  const Table t = split_table(num_layers, stages, time), y = split_table(num_layers, stages, sync);
  std::vector<double> caps;
  // The largest finite sync value below `below` (the sync values are scanned, not sorted: most
  // calls stop at the first theta).
  auto sync_below = [&y](double below, double& out) {
    bool found = false;
    for (const auto& row : y)
      for (double v : row)
        if (v < kInfeasible && v < below && (!found || v > out)) out = v, found = true;
    return found;
  };
  double theta = 0;
  if (!sync_below(kInfeasible, theta)) theta = 0;
  while (true) {
    Table tr = t;  // stages with sync <= theta
    caps.clear();
    for (size_t s = 0; s < tr.size(); ++s)
      for (size_t n = 0; n < tr[s].size(); ++n) {
        if (!(y[s][n] <= theta)) tr[s][n] = kInfeasible;
        if (tr[s][n] < kInfeasible) caps.push_back(tr[s][n]);
      }
    const SplitResult mm = split_dp(tr, num_layers, kInfeasible, split_max);
    if (!mm.ok) break;  // a lower theta only removes stages
    const SplitResult ms = split_dp(tr, num_layers, kInfeasible, split_sum);
    if (ms.sum_time + k * mm.max_time >= best.value) break;
    std::sort(caps.begin(), caps.end());
    caps.erase(std::unique(caps.begin(), caps.end()), caps.end());
    double found_sync = 0;
    for (auto it = std::lower_bound(caps.begin(), caps.end(), mm.max_time); it != caps.end(); ++it) {
      if (ms.sum_time + k * *it >= best.value) break;  // every split with max time >= *it
      SplitResult r = k > 0 ? split_dp(tr, num_layers, *it, split_sum) : ms;
      r.max_sync = 0;
      for (size_t s = 0; s < y.size(); ++s) r.max_sync = std::max(r.max_sync, y[s][static_cast<size_t>(r.layers[s])]);
      found_sync = std::max(found_sync, r.max_sync);
      r.value = r.sum_time + k * r.max_time + r.max_sync;
      if (r.value < best.value) best = r;
      // From the uncapped min-sum split's largest stage time on, every cap gives that split.
      if (k <= 0 || *it >= ms.max_time) break;
    }
    // Next theta: the largest sync value below every split found here (above it nothing changes).
    if (!sync_below(std::min(found_sync, theta), theta)) break;
  }
  if (best.layers.empty()) return SplitResult{};  // nothing below the cutoff
  return best;
}

}  // namespace ckpt::trainer
