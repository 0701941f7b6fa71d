#include "reshard/layout/balance.h"

#include <algorithm>

namespace ckpt {

std::vector<int> balance_greedy(const std::vector<uint64_t>& sizes, int bins) {
  std::vector<size_t> order(sizes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return sizes[a] > sizes[b]; });
  std::vector<uint64_t> load(static_cast<size_t>(std::max(bins, 1)), 0);
  std::vector<int> bin_of(sizes.size(), 0);
  for (size_t i : order) {
    size_t best = 0;
    for (size_t b = 1; b < load.size(); ++b)
      if (load[b] < load[best]) best = b;
    load[best] += sizes[i] + 1;
    bin_of[i] = static_cast<int>(best);
  }
  return bin_of;
}

std::vector<size_t> balanced_share(const std::vector<uint64_t>& sizes, int bins, int bin) {
  const std::vector<int> bin_of = balance_greedy(sizes, bins);
  std::vector<size_t> mine;
  for (size_t i = 0; i < bin_of.size(); ++i)
    if (bin_of[i] == bin) mine.push_back(i);
  return mine;
}

}  // namespace ckpt
