// The pieces the trainer's gradient checks share (gradcheck_test.cc: dense LLaMA; moe_gradcheck_test.cc:
// the MoE families): deterministic token ids, weights moved off their init, the finite-difference
// comparison of every parameter, and the float32 model against the float64 one.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "trainer/model/model.h"

namespace ckpt::trainer::gradcheck {

// n ids in [0, V) from a 64-bit LCG seeded with `x`.
inline std::vector<int32_t> lcg_ids(int64_t n, int64_t V, uint64_t x) {
  std::vector<int32_t> r;
  for (int64_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    r.push_back(static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(V)));
  }
  return r;
}

// Weights off their init: decayed ones x10 plus noise (large enough for non-trivial gradients, and
// routing far from ties), norms and biases 1 +- 0.25.
template <class T>
void perturb(Model<T>& m, uint64_t x) {
  for (auto* p : m.params())
    for (auto& v : p->w) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      const double u = static_cast<double>(x >> 11) * 0x1.0p-53 - 0.5;
      v = p->decay ? static_cast<T>(v * 10 + 0.1 * u) : static_cast<T>(1 + 0.5 * u);
    }
}

// Central differences (h = 1e-5) of m.forward's loss x scale against the analytic gradients m holds
// (forward_backward already run on the same tokens): per parameter its largest-gradient element and 8
// spread ones, or every element where every_element(name); within 1e-6 of the tensor's largest
// gradient. Returns the number of parameters checked.
inline int expect_finite_differences(Model<double>& m, const std::vector<int32_t>& tok, const std::vector<int32_t>& tgt, int64_t b,
                                     int64_t seq, double scale, const std::function<bool(const std::string&)>& every_element) {
  auto loss_at = [&]() {
    auto r = m.forward(tok.data(), tgt.data(), b, seq, nullptr);
    EXPECT_TRUE(r.ok());
    return *r * scale;
  };
  int kinds = 0;
  for (auto* p : m.params()) {
    ++kinds;
    double gmax = 0;
    for (double g : p->g) gmax = std::max(gmax, std::abs(g));
    EXPECT_GT(gmax, 1e-8) << p->name << " has an all-zero gradient";
    std::vector<size_t> idx;
    idx.push_back(static_cast<size_t>(
        std::max_element(p->g.begin(), p->g.end(), [](double a, double bb) { return std::abs(a) < std::abs(bb); }) - p->g.begin()));
    const bool all = every_element && every_element(p->name);
    const size_t count = all ? p->w.size() : 8;
    for (size_t k = 0; k < count; ++k) idx.push_back(all ? k : (k * 7919 + 13) % p->w.size());
    for (size_t i : idx) {
      const double h = 1e-5, w0 = p->w[i];
      p->w[i] = w0 + h;
      const double lp = loss_at();
      p->w[i] = w0 - h;
      const double lm = loss_at();
      p->w[i] = w0;
      const double fd = (lp - lm) / (2 * h);
      EXPECT_NEAR(p->g[i], fd, 1e-6 * gmax + 1e-12) << p->name << "[" << i << "] analytic " << p->g[i] << " vs finite difference " << fd;
    }
  }
  return kinds;
}

// The float32 model of `c` against its float64 twin (same init, 3 x 9 tokens): loss within 1e-5
// relative, every gradient within 1e-4 of its tensor's largest.
inline void expect_fp32_matches_fp64(const LlamaConfig& c, const std::vector<int32_t>& tok, const std::vector<int32_t>& tgt) {
  auto m64 = std::move(Model<double>::create(c)).value();
  auto m32 = std::move(Model<float>::create(c)).value();
  ASSERT_TRUE(m64.init(9).ok());
  ASSERT_TRUE(m32.init(9).ok());
  m64.zero_grad();
  m32.zero_grad();
  auto l64 = m64.forward_backward(tok.data(), tgt.data(), 3, 9, 1.0 / 27);
  auto l32 = m32.forward_backward(tok.data(), tgt.data(), 3, 9, 1.0f / 27);
  ASSERT_TRUE(l64.ok() && l32.ok());
  EXPECT_NEAR(*l32, *l64, 1e-5 * std::abs(*l64));
  auto p64 = m64.params();
  auto p32 = m32.params();
  ASSERT_EQ(p64.size(), p32.size());
  for (size_t k = 0; k < p64.size(); ++k) {
    double gmax = 0, err = 0;
    for (size_t i = 0; i < p64[k]->g.size(); ++i) {
      gmax = std::max(gmax, std::abs(p64[k]->g[i]));
      err = std::max(err, std::abs(p64[k]->g[i] - static_cast<double>(p32[k]->g[i])));
    }
    EXPECT_LT(err, 1e-4 * gmax) << p64[k]->name;
  }
}

}  // namespace ckpt::trainer::gradcheck
