// Finite-difference gradient checks of the hand-written backward pass, every parameter kind,
// tied and untied, GQA and MHA, in double precision (Model<double>): central differences with
// h = 1e-5 have truncation error ~h^2 * |f'''| ~ 1e-10 and round-off ~1e-16 / h ~ 1e-11 relative
// to the O(1) loss, so 1e-6 relative agreement (against the largest gradient of the tensor)
// is a strict test. The fp32 model is then checked against the fp64 one (1e-4 relative).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "tests/trainer/gradcheck_util.h"
#include "trainer/data.h"
#include "trainer/model/model.h"

namespace ckpt::trainer {
namespace {

using namespace gradcheck;  // NOLINT

LlamaConfig tiny(bool tied, int64_t H, int64_t K) {
  LlamaConfig c;
  c.vocab_size = 40;
  c.hidden_size = 12;
  c.intermediate_size = 20;
  c.num_hidden_layers = 2;
  c.num_attention_heads = H;
  c.num_key_value_heads = K;
  c.head_dim = 6;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.max_position_embeddings = 64;
  c.tie_word_embeddings = tied;
  return c;
}

struct Batch {
  std::vector<int32_t> tok, tgt;
};

Batch make_batch(int64_t b, int64_t seq, int64_t V, uint64_t seed) {
  Batch r;
  uint64_t x = seed;
  for (int64_t i = 0; i < b * seq; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    r.tok.push_back(static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(V)));
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    r.tgt.push_back(static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(V)));
  }
  return r;
}

void check_model(bool tied, int64_t H, int64_t K) {
  const LlamaConfig c = tiny(tied, H, K);
  auto mr = Model<double>::create(c);
  ASSERT_TRUE(mr.ok()) << mr.status().to_string();
  Model<double> m = std::move(mr).value();
  ASSERT_TRUE(m.init(5).ok());
  perturb(m, 99);
  const int64_t b = 2, seq = 7;
  const Batch bt = make_batch(b, seq, c.vocab_size, 3);
  const double scale = 1.0 / static_cast<double>(b * seq);
  m.zero_grad();
  auto l = m.forward_backward(bt.tok.data(), bt.tgt.data(), b, seq, scale);
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  const int kinds = expect_finite_differences(m, bt.tok, bt.tgt, b, seq, scale, nullptr);
  EXPECT_EQ(kinds, static_cast<int>(llama_model_tensors(c, DType::kF32).size()));
}

TEST(GradCheck, UntiedGqa) { check_model(false, 4, 2); }
TEST(GradCheck, TiedGqaSingleKvHead) { check_model(true, 4, 1); }
TEST(GradCheck, UntiedMha) { check_model(false, 2, 2); }

TEST(GradCheck, Fp32MatchesFp64) {
  const LlamaConfig c = tiny(false, 4, 2);
  const Batch bt = make_batch(3, 9, c.vocab_size, 4);
  expect_fp32_matches_fp64(c, bt.tok, bt.tgt);
}

TEST(GradAccum, TwoMicroBatchesEqualOneBigBatch) {
  LlamaConfig c = tiny(false, 4, 2);
  c.vocab_size = 260;
  auto a = std::move(Model<float>::create(c)).value();
  auto b = std::move(Model<float>::create(c)).value();
  ASSERT_TRUE(a.init(1).ok());
  ASSERT_TRUE(b.init(1).ok());
  TokenStream ds = TokenStream::procedural(3);
  const int64_t seq = 10;
  std::vector<int32_t> tok(4 * seq), tgt(4 * seq);
  ASSERT_TRUE(ds.batch(0, 0, 4, seq, tok.data(), tgt.data()).ok());
  a.zero_grad();
  b.zero_grad();
  const float s = 1.0f / (4 * seq);
  auto la = a.forward_backward(tok.data(), tgt.data(), 4, seq, s);
  auto lb1 = b.forward_backward(tok.data(), tgt.data(), 2, seq, s);
  auto lb2 = b.forward_backward(tok.data() + 2 * seq, tgt.data() + 2 * seq, 2, seq, s);
  ASSERT_TRUE(la.ok() && lb1.ok() && lb2.ok());
  EXPECT_NEAR(*la, *lb1 + *lb2, 1e-5 * *la);
  auto pa = a.params(), pb = b.params();
  for (size_t k = 0; k < pa.size(); ++k) {
    float gmax = 0, err = 0;
    for (size_t i = 0; i < pa[k]->g.size(); ++i) {
      gmax = std::max(gmax, std::abs(pa[k]->g[i]));
      err = std::max(err, std::abs(pa[k]->g[i] - pb[k]->g[i]));
    }
    EXPECT_LE(err, 1e-5f * gmax) << pa[k]->name;
  }
}

TEST(ModelErrors, RejectsBadTokensAndConfigs) {
  LlamaConfig c = tiny(false, 4, 2);
  auto m = std::move(Model<float>::create(c)).value();
  std::vector<int32_t> tok = {1, 2, 40}, tgt = {0, 1, 2};
  auto r = m.forward(tok.data(), tgt.data(), 1, 3, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("outside the vocabulary"), std::string::npos);
  tok[2] = -1;
  EXPECT_FALSE(m.forward(tok.data(), tgt.data(), 1, 3, nullptr).ok());
  tok[2] = 3;
  tgt[0] = 99;
  EXPECT_FALSE(m.forward_backward(tok.data(), tgt.data(), 1, 3, 1.0f).ok());
  std::vector<int32_t> longtok(65, 1), longtgt(65, 1);
  EXPECT_FALSE(m.forward(longtok.data(), longtgt.data(), 1, 65, nullptr).ok());  // > max positions
  LlamaConfig big = c;
  big.vocab_size = int64_t{1} << 40;
  EXPECT_FALSE(Model<float>::create(big).ok());
  LlamaConfig bias = c;
  bias.attention_bias = true;
  EXPECT_EQ(Model<float>::create(bias).status().kind(), ErrorKind::kUnsupported);
}

}  // namespace
}  // namespace ckpt::trainer
