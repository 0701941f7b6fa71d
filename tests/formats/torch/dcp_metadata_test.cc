// parse_dcp_metadata on .metadata files written by torch.distributed.checkpoint.save (the fuzz
// seeds, tests/fuzz/seeds/dcp_metadata/): what torch's DTensor sharding puts in them (Shard(1) of 7
// columns over 2 ranks: 4 + 3), bytes items, and every truncation refused without a crash.
// The rule-by-rule matrix runs on whole directories in tests/python/test_dcp_hostile.py.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "formats/torch/dcp/dcp.h"
#include "tests/test_cases.h"

namespace ckpt::torch {
namespace {

std::string seed(const std::string& name) {
  std::ifstream f(std::string(CKPT_SOURCE_DIR) + "/tests/fuzz/seeds/dcp_metadata/" + name, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const DcpTensor* find(const DcpMetadata& m, const std::string& fqn) {
  for (const auto& t : m.tensors)
    if (t.fqn == fqn) return &t;
  return nullptr;
}

TEST(DcpMetadata, TwoRankDTensorSave) {
  auto m = parse_dcp_metadata(seed("sharded_2rank"));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->version, "1.0.0");
  ASSERT_EQ(m->tensors.size(), 5u);
  const DcpTensor* cols = find(*m, "w_cols_uneven");
  ASSERT_NE(cols, nullptr);
  EXPECT_EQ(cols->size, (Shape{5, 7}));
  EXPECT_EQ(cols->dtype, DType::kF32);
  ASSERT_EQ(cols->chunks.size(), 2u);
  EXPECT_EQ(cols->chunks[0].offsets, (Shape{0, 0}));
  EXPECT_EQ(cols->chunks[0].sizes, (Shape{5, 4}));
  EXPECT_EQ(cols->chunks[1].offsets, (Shape{0, 4}));
  EXPECT_EQ(cols->chunks[1].sizes, (Shape{5, 3}));
  EXPECT_NE(cols->chunks[0].file, cols->chunks[1].file);  // one chunk per rank file
  const DcpTensor* bf = find(*m, "b_rows_bf16");
  ASSERT_NE(bf, nullptr);
  EXPECT_EQ(bf->dtype, DType::kBF16);
  const DcpTensor* sc = find(*m, "layers.0.scalar");
  ASSERT_NE(sc, nullptr);
  EXPECT_TRUE(sc->size.empty());
  ASSERT_EQ(sc->chunks.size(), 1u);
  ASSERT_EQ(m->bytes.size(), 1u);
  EXPECT_EQ(m->bytes[0].fqn, "step");
  EXPECT_GT(m->bytes[0].length, 0u);
}

TEST(DcpMetadata, BytesItemsAndNestedKeys) {
  auto m = parse_dcp_metadata(seed("bytes_items"));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ASSERT_EQ(m->bytes.size(), 2u);
  EXPECT_EQ(m->bytes[1].fqn, "extra.x");  // DCP flattens nested dicts with '.'
}

TEST(DcpMetadata, EveryTruncationIsRefused) {
  const std::string s = seed("sharded_2rank");
  ASSERT_FALSE(s.empty());
#if defined(CKPT_TEST_SANITIZED)
  const size_t step = 7;  // under ASan (a tenth of the speed) every 7th length, and the longest
#else
  const size_t step = 1;
#endif
  std::vector<size_t> lengths;
  for (size_t n = 0; n < s.size(); n += step) lengths.push_back(n);
  lengths.push_back(s.size() - 1);
  for (size_t n : lengths) {
    auto m = parse_dcp_metadata(std::string_view(s).substr(0, n));
    EXPECT_FALSE(m.ok()) << "prefix of " << n << " bytes";
  }
}

TEST(DcpMetadata, RelativePaths) {
  EXPECT_TRUE(check_dcp_relative_path("__0_0.distcp", "a").ok());
  EXPECT_TRUE(check_dcp_relative_path("sub/__0_0.distcp", "a").ok());
  for (const char* bad : {"", "/etc/passwd", "../x", "a/../../x", ".."})
    EXPECT_EQ(check_dcp_relative_path(bad, "a").code(), "DcpBadPath") << bad;
}

}  // namespace
}  // namespace ckpt::torch
