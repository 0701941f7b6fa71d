// The token stream: sample (seed, step, index) is deterministic and independent of how a step
// is split into micro-batches; targets are the next tokens; file corpora are validated.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "trainer/data.h"

namespace ckpt::trainer {
namespace {

TEST(Data, DeterministicAndSplitIndependent) {
  TokenStream a = TokenStream::procedural(5), b = TokenStream::procedural(5);
  const int64_t T = 48;
  std::vector<int32_t> t4(4 * T), y4(4 * T), t2(2 * T), y2(2 * T);
  ASSERT_TRUE(a.batch(3, 0, 4, T, t4.data(), y4.data()).ok());
  ASSERT_TRUE(b.batch(3, 2, 2, T, t2.data(), y2.data()).ok());  // samples 2, 3 alone
  for (int64_t i = 0; i < 2 * T; ++i) {
    EXPECT_EQ(t2[i], t4[2 * T + i]);
    EXPECT_EQ(y2[i], y4[2 * T + i]);
  }
  // Next-token targets, BOS first.
  for (int64_t s = 0; s < 4; ++s) {
    EXPECT_EQ(t4[s * T], kBosToken);
    for (int64_t t = 0; t + 1 < T; ++t) EXPECT_EQ(t4[s * T + t + 1], y4[s * T + t]);
    for (int64_t t = 0; t < T; ++t) {
      EXPECT_GE(y4[s * T + t], 0);
      EXPECT_LT(y4[s * T + t], 256);
    }
  }
  // Different step, index or seed: different text.
  EXPECT_NE(a.procedural_text(3, 0, 64), a.procedural_text(4, 0, 64));
  EXPECT_NE(a.procedural_text(3, 0, 64), a.procedural_text(3, 1, 64));
  EXPECT_NE(a.procedural_text(3, 0, 64), TokenStream::procedural(6).procedural_text(3, 0, 64));
  EXPECT_EQ(a.procedural_text(3, 0, 64), b.procedural_text(3, 0, 64));
}

TEST(Data, FileCorpusWindowsAndErrors) {
  const std::string path = testing::TempDir() + "/trainer_corpus.txt";
  {
    std::ofstream f(path, std::ios::binary);
    for (int i = 0; i < 1000; ++i) f.put(static_cast<char>(i % 251));
  }
  auto ts = TokenStream::from_file(9, path);
  ASSERT_TRUE(ts.ok()) << ts.status().to_string();
  std::vector<int32_t> t(32), y(32);
  ASSERT_TRUE(ts->sample(1, 2, 32, t.data(), y.data()).ok());
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], (t[i] + 1) % 251);
  std::vector<int32_t> big(1000), bigy(1000);
  EXPECT_FALSE(ts->sample(0, 0, 1000, big.data(), bigy.data()).ok());  // needs seq + 1 bytes
  EXPECT_FALSE(TokenStream::from_file(1, path + ".missing").ok());
  {
    std::ofstream f(path, std::ios::binary);
    f.put('x');
  }
  EXPECT_FALSE(TokenStream::from_file(1, path).ok());  // 1 byte: too small
  std::remove(path.c_str());
}

}  // namespace
}  // namespace ckpt::trainer
