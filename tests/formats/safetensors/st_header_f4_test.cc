// F4 and F8_E8M0 in the safetensors header (st_header.h): F4 shapes count values in the file and
// packed pairs in ckpt; an odd last dimension is F4OddLastDim; the writer's order is the
// reference's (checked against safetensors 0.8.0's own writer in tests/python/test_low_precision_dtypes.py).
#include <gtest/gtest.h>

#include <string>

#include "formats/safetensors/st_header.h"

namespace ckpt::safetensors {
namespace {

std::string f4_le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return s;
}
Result<Header> parse_f4(const std::string& header, size_t data) {
  const std::string bytes = f4_le64(header.size()) + header + std::string(data, '\0');
  return parse_file_bytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

TEST(SafetensorsF4, ShapeCountsValuesInTheFilePairsInCkpt) {
  auto h = parse_f4(R"({"a":{"dtype":"F4","shape":[3,8],"data_offsets":[0,12]},"s":{"dtype":"F8_E8M0","shape":[3],"data_offsets":[12,15]}})", 15);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  EXPECT_EQ(h->tensors[0].dtype, DType::kF4);
  EXPECT_EQ(h->tensors[0].shape, (Shape{3, 4}));
  EXPECT_EQ(h->tensors[1].dtype, DType::kF8E8M0);
}

TEST(SafetensorsF4, OddLastDimension) {
  // [2, 3]: 6 values, 3 bytes, valid for the reference, but each row would end inside a byte.
  auto h = parse_f4(R"({"a":{"dtype":"F4","shape":[2,3],"data_offsets":[0,3]}})", 3);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), "F4OddLastDim");
  EXPECT_EQ(parse_f4(R"({"a":{"dtype":"F4","shape":[],"data_offsets":[0,1]}})", 1).status().code(), "F4OddLastDim");
  // Bytes still checked against the pairs: [2, 4] is 4 bytes.
  EXPECT_EQ(parse_f4(R"({"a":{"dtype":"F4","shape":[2,4],"data_offsets":[0,8]}})", 8).status().code(), "TensorInvalidInfo");
}

TEST(SafetensorsF4, WriterDoublesTheLastDimensionAndOrdersAsTheReference) {
  std::vector<TensorEntry> e = {{"f4", DType::kF4, {2}, 0, 0}, {"e8", DType::kF8E8M0, {2}, 0, 0}, {"u8", DType::kU8, {2}, 0, 0},
                                {"b", DType::kBool, {2}, 0, 0}, {"e4", DType::kF8E4M3, {2}, 0, 0}, {"i16", DType::kI16, {2}, 0, 0}};
  auto j = build_header(e, nullptr);
  ASSERT_TRUE(j.ok()) << j.status().to_string();
  EXPECT_EQ(j->substr(0, j->find_last_not_of(' ') + 1),
            R"({"i16":{"dtype":"I16","shape":[2],"data_offsets":[0,4]},"e8":{"dtype":"F8_E8M0","shape":[2],"data_offsets":[4,6]},)"
            R"("e4":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[6,8]},"u8":{"dtype":"U8","shape":[2],"data_offsets":[8,10]},)"
            R"("f4":{"dtype":"F4","shape":[4],"data_offsets":[10,12]},"b":{"dtype":"BOOL","shape":[2],"data_offsets":[12,14]}})");
}

}  // namespace
}  // namespace ckpt::safetensors
