// reshard/layout/balance.h: the shares tile the items, and greedy largest-first keeps every bin within
// the largest item (+1 per item) of the lightest one (the list-scheduling bound).
#include "reshard/layout/balance.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

namespace ckpt {
namespace {

TEST(Balance, SharesTileTheItemsAndStayWithinTheLargestItem) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int bins = 1 + static_cast<int>(rng() % 9);
    std::vector<uint64_t> sizes(rng() % 40);
    for (auto& s : sizes) s = rng() % 3 == 0 ? 0 : rng() % 1000;
    std::vector<int> seen(sizes.size(), 0);
    std::vector<uint64_t> load(static_cast<size_t>(bins), 0);
    for (int b = 0; b < bins; ++b)
      for (size_t i : balanced_share(sizes, bins, b)) {
        ++seen[i];
        load[static_cast<size_t>(b)] += sizes[i] + 1;
      }
    for (int n : seen) EXPECT_EQ(n, 1);
    const uint64_t largest = sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end()) + 1;
    EXPECT_LE(*std::max_element(load.begin(), load.end()) - *std::min_element(load.begin(), load.end()), largest);
    EXPECT_EQ(balance_greedy(sizes, bins), balance_greedy(sizes, bins));  // deterministic
  }
}

TEST(Balance, EqualItemsGoRoundRobinLargestFirst) {
  EXPECT_EQ(balance_greedy({5, 5, 5, 5}, 2), (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(balance_greedy({1, 9, 4}, 2), (std::vector<int>{1, 0, 1}));
}

}  // namespace
}  // namespace ckpt
