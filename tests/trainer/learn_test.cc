// It learns: on fixtures/tiny_llama.json with the procedural corpus, the training loss falls well
// below both ln(256) (uniform over bytes) and the corpus' unigram entropy (the best a model that
// ignores context can do; measured here by counting bytes of 4000 independent samples), and
// training is deterministic from the seed.
#include <gtest/gtest.h>

#include <cmath>

#include "trainer/data.h"
#include "trainer/train_loop.h"

namespace ckpt::trainer {
namespace {

TrainOptions tiny_options(int64_t steps) {
  TrainOptions o;
  auto cfg = LlamaConfig::from_file(std::string(CKPT_SOURCE_DIR) + "/fixtures/tiny_llama.json");
  EXPECT_TRUE(cfg.ok()) << cfg.status().to_string();
  o.config = *cfg;
  o.steps = steps;
  o.seed = 1234;
  o.lr = 3e-3;
  o.warmup = 20;
  o.micro_batch = 8;
  o.seq_len = 64;
  o.print = false;
  return o;
}

double unigram_entropy_nats() {
  TokenStream ds = TokenStream::procedural(1234);
  std::vector<double> count(256, 0);
  double n = 0;
  for (int64_t i = 0; i < 4000; ++i)
    for (unsigned char ch : ds.procedural_text(1000000 + i, 0, 64).substr(0, 64)) {
      count[ch] += 1;
      n += 1;
    }
  double h = 0;
  for (double c : count)
    if (c > 0) h -= c / n * std::log(c / n);
  return h;
}

TEST(Learn, LossFallsBelowUnigramEntropy) {
  const double h1 = unigram_entropy_nats();
  EXPECT_LT(h1, std::log(256.0));
  const int64_t steps = 300;
  auto t = Trainer::create(tiny_options(steps));
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  std::vector<double> losses;
  ASSERT_TRUE((*t)->run([&](const StepStats& s) { losses.push_back(s.loss); }).ok());
  ASSERT_EQ(static_cast<int64_t>(losses.size()), steps);
  EXPECT_NEAR(losses[0], std::log(264.0), 0.1);  // N(0, 0.02) init: near-uniform prediction
  double last = 0;
  for (int i = 0; i < 20; ++i) last += losses[losses.size() - 1 - i] / 20;
  std::printf("unigram entropy %.3f nats, first loss %.3f, mean of last 20 losses %.3f\n", h1,
              losses[0], last);
  EXPECT_LT(last, h1 - 0.5);
}

TEST(Learn, DeterministicFromSeed) {
  std::vector<double> a, b;
  auto t1 = Trainer::create(tiny_options(4));
  auto t2 = Trainer::create(tiny_options(4));
  ASSERT_TRUE(t1.ok() && t2.ok());
  ASSERT_TRUE((*t1)->run([&](const StepStats& s) { a.push_back(s.loss); }).ok());
  ASSERT_TRUE((*t2)->run([&](const StepStats& s) { b.push_back(s.loss); }).ok());
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace ckpt::trainer
