// AdamW, clipping, schedule and initialization against naive, independent restatements of the
// documented formulas (torch.optim.AdamW docs; clip_grad_norm_; docs/TRAINER.md), in double.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "converters/model/llama_config.h"
#include "trainer/model/init.h"
#include "trainer/optim/adamw.h"
#include "trainer/optim/lr_schedule.h"

namespace ckpt::trainer {
namespace {

TEST(AdamW, MatchesTextbookFormulaOverSteps) {
  const int n = 257;
  std::vector<float> w(n), g(n), wn(n);
  std::vector<double> ref(n), m(n, 0), v(n, 0);
  for (int i = 0; i < n; ++i) ref[i] = w[i] = wn[i] = 0.05f * std::sin(0.37f * i);
  AdamW opt;  // beta1 0.9, beta2 0.95, eps 1e-8, wd 0.1
  opt.add("a.weight", {n}, Region{Box::whole({n})}, w.data(), g.data(), n, true);
  opt.add("model.norm.weight", {n}, Region{Box::whole({n})}, wn.data(), g.data(), n, false);
  std::vector<double> refn(wn.begin(), wn.end()), mn(n, 0), vn(n, 0);
  const double b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  for (int t = 1; t <= 6; ++t) {
    const double lr = 1e-3 * t;
    for (int i = 0; i < n; ++i) g[i] = 0.01f * std::cos(0.11f * i * t) + (i == 3 ? 1e-9f : 0.f);
    opt.step(lr, t);
    for (int i = 0; i < n; ++i) {
      const double gi = g[i];
      // decoupled decay, then Adam with bias correction
      ref[i] *= 1 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * gi;
      v[i] = b2 * v[i] + (1 - b2) * gi * gi;
      const double mh = m[i] / (1 - std::pow(b1, t)), vh = v[i] / (1 - std::pow(b2, t));
      ref[i] -= lr * mh / (std::sqrt(vh) + eps);
      mn[i] = b1 * mn[i] + (1 - b1) * gi;
      vn[i] = b2 * vn[i] + (1 - b2) * gi * gi;
      refn[i] -= lr * (mn[i] / (1 - std::pow(b1, t))) / (std::sqrt(vn[i] / (1 - std::pow(b2, t))) + eps);
    }
  }
  for (int i = 0; i < n; ++i) {
    EXPECT_NEAR(w[i], ref[i], 2e-7) << i;
    EXPECT_NEAR(wn[i], refn[i], 2e-7) << i;  // no decay on norms
    EXPECT_NEAR(opt.slots()[0].exp_avg[i], m[i], 1e-8);
    EXPECT_NEAR(opt.slots()[0].exp_avg_sq[i], v[i], 1e-10);
  }
}

TEST(AdamW, ClipCoefLikeTorch) {
  EXPECT_FLOAT_EQ(AdamW::clip_coef(4.0, 1.0), static_cast<float>(1.0 / (4.0 + 1e-6)));
  EXPECT_EQ(AdamW::clip_coef(0.5, 1.0), 1.0f);
  std::vector<float> w(3, 0), g = {3, 4, 0};
  AdamW opt;
  opt.add("x", {3}, Region{Box::whole({3})}, w.data(), g.data(), 3, true);
  EXPECT_DOUBLE_EQ(std::sqrt(opt.grad_sq_sum()), 5.0);
  opt.scale_grads(AdamW::clip_coef(5.0, 1.0));
  EXPECT_NEAR(g[0], 0.6f, 1e-6);
  EXPECT_NEAR(g[1], 0.8f, 1e-6);
}

TEST(Schedule, WarmupThenCosineToTenPercent) {
  LrSchedule s{1e-3, 10, 110, 0.1};
  EXPECT_DOUBLE_EQ(s.at(0), 1e-4);
  EXPECT_DOUBLE_EQ(s.at(4), 5e-4);
  EXPECT_DOUBLE_EQ(s.at(9), 1e-3);
  EXPECT_DOUBLE_EQ(s.at(10), 1e-3);                        // cosine starts at the peak
  EXPECT_NEAR(s.at(60), 1e-4 + 0.9e-3 * 0.5, 1e-15);      // half way: (peak + min) / 2
  EXPECT_NEAR(s.at(110), 1e-4, 1e-15);
  EXPECT_NEAR(s.at(500), 1e-4, 1e-15);                    // held at the floor
  auto back = LrSchedule::from_json(s.to_json());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->at(37), s.at(37));
  EXPECT_FALSE(LrSchedule::from_json(nlohmann::json{{"kind", "warmup_cosine"}}).ok());
  EXPECT_FALSE(LrSchedule::from_json(nlohmann::json::array()).ok());
}

TEST(Init, AnySubBoxEqualsTheSameSliceOfTheWhole) {
  const Shape shape = {7, 5, 6};
  std::vector<float> whole(7 * 5 * 6);
  ASSERT_TRUE(init_box<float>(42, "model.layers.0.self_attn.q_proj.weight", shape, Box::whole(shape), whole.data()).ok());
  const Box sub{{2, 1, 3}, {4, 3, 2}};
  std::vector<float> part(4 * 3 * 2);
  ASSERT_TRUE(init_box<float>(42, "model.layers.0.self_attn.q_proj.weight", shape, sub, part.data()).ok());
  int k = 0;
  for (int a = 0; a < 4; ++a)
    for (int b = 0; b < 3; ++b)
      for (int c = 0; c < 2; ++c)
        EXPECT_EQ(part[k++], whole[((2 + a) * 5 + (1 + b)) * 6 + (3 + c)]);
  // Out-of-bounds boxes are refused.
  EXPECT_FALSE(init_box<float>(42, "w", shape, Box{{6, 0, 0}, {2, 5, 6}}, part.data()).ok());
}

TEST(Init, StatisticsAndDependenceOnSeedAndName) {
  const int64_t n = 200000;
  std::vector<double> a(n), b(n), c(n);
  ASSERT_TRUE(init_box<double>(1, "model.embed_tokens.weight", {n}, Box::whole({n}), a.data()).ok());
  ASSERT_TRUE(init_box<double>(2, "model.embed_tokens.weight", {n}, Box::whole({n}), b.data()).ok());
  ASSERT_TRUE(init_box<double>(1, "lm_head.weight", {n}, Box::whole({n}), c.data()).ok());
  double mean = 0, sq = 0, cab = 0, cac = 0, kurt = 0;
  for (int64_t i = 0; i < n; ++i) {
    mean += a[i];
    sq += a[i] * a[i];
    cab += a[i] * b[i];
    cac += a[i] * c[i];
  }
  mean /= n;
  const double sd = std::sqrt(sq / n - mean * mean);
  for (int64_t i = 0; i < n; ++i) kurt += std::pow((a[i] - mean) / sd, 4);
  EXPECT_NEAR(mean, 0, 5 * 0.02 / std::sqrt(double(n)));
  EXPECT_NEAR(sd, 0.02, 0.0005);
  EXPECT_NEAR(kurt / n, 3.0, 0.1);  // normal, not uniform (1.8)
  EXPECT_LT(std::abs(cab / n) / (sd * sd), 0.02);  // seed changes values
  EXPECT_LT(std::abs(cac / n) / (sd * sd), 0.02);  // name changes values
  std::vector<float> norm(16);
  ASSERT_TRUE(init_box<float>(1, "model.layers.3.input_layernorm.weight", {16}, Box::whole({16}), norm.data()).ok());
  for (float x : norm) EXPECT_EQ(x, 1.0f);
}

}  // namespace
}  // namespace ckpt::trainer
