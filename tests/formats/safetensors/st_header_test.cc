// Bad-input matrix for the safetensors header (one case per rule, handcrafted bytes) and the
// reference's golden serializations (test_empty, test_serialization).
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "formats/safetensors/st_header.h"

namespace ckpt::safetensors {
namespace {

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return s;
}
// 8-byte length + header + data.
std::string file_of(const std::string& header, const std::string& data) { return le64(header.size()) + header + data; }

Result<Header> parse(const std::string& bytes) {
  return parse_file_bytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}
std::string code_of(const std::string& bytes) {
  auto r = parse(bytes);
  return r.ok() ? "OK" : r.status().code();
}
std::string t(const std::string& name, const std::string& dtype, const std::string& shape, uint64_t b, uint64_t e) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" + std::to_string(b) + "," +
         std::to_string(e) + "]}";
}

TEST(SafetensorsHeader, HeaderTooSmall) {
  EXPECT_EQ(code_of(""), "HeaderTooSmall");
  EXPECT_EQ(code_of("\x02\0\0\0\0"), "HeaderTooSmall");
}

TEST(SafetensorsHeader, HeaderTooLarge) {
  EXPECT_EQ(code_of(le64(100'000'001) + "{}"), "HeaderTooLarge");
  EXPECT_EQ(code_of(le64(UINT64_MAX) + "{}"), "HeaderTooLarge");
}

TEST(SafetensorsHeader, InvalidHeaderLength) {
  EXPECT_EQ(code_of(le64(100) + "{}"), "InvalidHeaderLength");
  EXPECT_EQ(code_of(le64(3) + "{}"), "InvalidHeaderLength");
  auto r = parse(le64(100) + "{}");
  EXPECT_NE(r.status().message().find("100"), std::string::npos) << r.status().to_string();
}

TEST(SafetensorsHeader, InvalidHeaderNotUtf8) {
  EXPECT_EQ(code_of(file_of("{\"\xff\":1}", "")), "InvalidHeader");
  EXPECT_EQ(code_of(file_of("{\"\xc0\xaf\":1}", "")), "InvalidHeader");      // overlong '/'
  EXPECT_EQ(code_of(file_of("{\"\xed\xa0\x80\":1}", "")), "InvalidHeader");  // surrogate
}

TEST(SafetensorsHeader, InvalidJson) {
  EXPECT_EQ(code_of(file_of("{\"a\":", "")), "InvalidHeaderDeserialization");
  EXPECT_EQ(code_of(file_of("{,}", "")), "InvalidHeaderDeserialization");
  EXPECT_EQ(code_of(file_of("[]", "")), "InvalidHeaderDeserialization");
  EXPECT_EQ(code_of(file_of("\"x\"", "")), "InvalidHeaderDeserialization");
  EXPECT_EQ(code_of(file_of("{} /* c */", "")), "InvalidHeaderDeserialization");
  EXPECT_EQ(code_of(file_of("", "")), "InvalidHeaderDeserialization");
}

TEST(SafetensorsHeader, TrailingBytesAfterJson) {
  EXPECT_EQ(code_of(file_of("{}x", "")), "InvalidHeaderDeserialization");
  EXPECT_EQ(code_of(file_of(std::string("{}\0\0", 4), "")), "InvalidHeaderDeserialization");
  EXPECT_EQ(code_of(file_of("{}{}", "")), "InvalidHeaderDeserialization");
  EXPECT_EQ(code_of(file_of(std::string("{}\0x", 4), "")), "InvalidHeaderDeserialization");
  EXPECT_EQ(code_of(file_of("\xEF\xBB\xBF{}", "")), "InvalidHeaderDeserialization");  // BOM
  // JSON whitespace around the object is accepted (the reference pads with spaces).
  EXPECT_EQ(code_of(file_of(" \n\t{}  \r\n ", "")), "OK");
}

TEST(SafetensorsHeader, UnknownAndUnsupportedDType) {
  EXPECT_EQ(code_of(file_of("{" + t("a", "F33", "[1]", 0, 4) + "}", std::string(4, '\0'))), "InvalidHeaderDeserialization");
  EXPECT_EQ(code_of(file_of("{" + t("a", "f32", "[1]", 0, 4) + "}", std::string(4, '\0'))), "InvalidHeaderDeserialization");
  auto r = parse(file_of("{" + t("a", "C64", "[1]", 0, 8) + "}", std::string(8, '\0')));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), "UnsupportedDType");
  EXPECT_EQ(r.status().kind(), ErrorKind::kUnsupported);
}

TEST(SafetensorsHeader, Gap) {
  std::string h = "{" + t("a", "F32", "[1]", 0, 4) + "," + t("b", "F32", "[1]", 8, 12) + "}";
  auto r = parse(file_of(h, std::string(12, '\0')));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), "InvalidOffset");
  EXPECT_EQ(r.status().tensor(), "b");
  // The first tensor must start at 0.
  EXPECT_EQ(code_of(file_of("{" + t("a", "F32", "[1]", 4, 8) + "}", std::string(8, '\0'))), "InvalidOffset");
}

TEST(SafetensorsHeader, Overlap) {
  std::string h = "{" + t("a", "F32", "[2]", 0, 8) + "," + t("b", "F32", "[2]", 4, 12) + "}";
  EXPECT_EQ(code_of(file_of(h, std::string(12, '\0'))), "InvalidOffset");
  // Two tensors sharing the same bytes.
  std::string h2 = "{" + t("a", "F32", "[1]", 0, 4) + "," + t("b", "F32", "[1]", 0, 4) + "}";
  EXPECT_EQ(code_of(file_of(h2, std::string(4, '\0'))), "InvalidOffset");
}

TEST(SafetensorsHeader, EndBeforeBegin) {
  EXPECT_EQ(code_of(file_of("{" + t("a", "F32", "[0]", 0, 0) + "," + t("b", "F32", "[1]", 4, 0) + "}", "")), "InvalidOffset");
}

TEST(SafetensorsHeader, OffsetsPastTheEnd) {
  EXPECT_EQ(code_of(file_of("{" + t("a", "F32", "[250]", 0, 1000) + "}", std::string(16, '\0'))), "MetadataIncompleteBuffer");
  // An end offset near 2^64 cannot wrap around the size check.
  EXPECT_EQ(code_of(file_of("{" + t("a", "U8", "[18446744073709551615]", 0, 18446744073709551615ull) + "}", "")),
            "ValidationOverflow");
}

TEST(SafetensorsHeader, SizeOverflow) {
  EXPECT_EQ(code_of(file_of("{" + t("a", "F32", "[4611686018427387904,8]", 0, 0) + "}", "")), "ValidationOverflow");
  EXPECT_EQ(code_of(file_of("{" + t("a", "F32", "[4611686018427387904]", 0, 0) + "}", "")), "ValidationOverflow");
  EXPECT_EQ(code_of(file_of("{" + t("a", "U8", "[9223372036854775808]", 0, 0) + "}", "")), "ValidationOverflow");
}

TEST(SafetensorsHeader, ByteLengthMismatch) {
  auto r = parse(file_of("{" + t("w", "F32", "[2,3]", 0, 20) + "}", std::string(20, '\0')));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), "TensorInvalidInfo");
  EXPECT_NE(r.status().message().find("expected 24 bytes"), std::string::npos) << r.status().to_string();
  EXPECT_NE(r.status().message().find("'w'"), std::string::npos);
}

TEST(SafetensorsHeader, MissingAndTrailingDataBytes) {
  std::string h = "{" + t("a", "F32", "[2]", 0, 8) + "}";
  EXPECT_EQ(code_of(file_of(h, std::string(8, '\0'))), "OK");
  EXPECT_EQ(code_of(file_of(h, std::string(7, '\0'))), "MetadataIncompleteBuffer");
  EXPECT_EQ(code_of(file_of(h, std::string(9, '\0'))), "MetadataIncompleteBuffer");
  EXPECT_EQ(code_of(file_of("{}", "x")), "MetadataIncompleteBuffer");
}

TEST(SafetensorsHeader, StricterThanReference) {
  // Duplicate tensor names (the reference keeps the last silently).
  std::string dup = "{" + t("a", "F32", "[1]", 0, 4) + "," + t("a", "F32", "[1]", 4, 8) + "}";
  EXPECT_EQ(code_of(file_of(dup, std::string(8, '\0'))), "DuplicateKey");
  EXPECT_EQ(code_of(file_of("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", "")), "DuplicateKey");
  EXPECT_EQ(code_of(file_of("{\"__metadata__\":{},\"__metadata__\":{}}", "")), "DuplicateKey");
  EXPECT_EQ(code_of(file_of("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", std::string(4, '\0'))),
            "DuplicateKey");
  EXPECT_EQ(code_of(file_of("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", std::string(4, '\0'))),
            "UnknownTensorField");
  EXPECT_EQ(code_of(file_of("{" + t("", "F32", "[1]", 0, 4) + "}", std::string(4, '\0'))), "InvalidTensorName");
  std::string many = "[";
  for (int i = 0; i < 65; ++i) many += (i ? ",1" : "1");
  many += "]";
  EXPECT_EQ(code_of(file_of("{" + t("a", "U8", many, 0, 1) + "}", std::string(1, '\0'))), "TooManyDimensions");
}

TEST(SafetensorsHeader, FieldTypes) {
  EXPECT_EQ(code_of(file_of("{\"__metadata__\":{\"k\":1}}", "")), "InvalidHeaderDeserialization");
  EXPECT_EQ(code_of(file_of("{\"__metadata__\":[]}", "")), "InvalidHeaderDeserialization");
  EXPECT_EQ(code_of(file_of("{\"__metadata__\":\"x\"}", "")), "InvalidHeaderDeserialization");
  EXPECT_EQ(code_of(file_of("{\"__metadata__\":null}", "")), "OK");
  EXPECT_EQ(code_of(file_of("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", std::string(4, '\0'))), "InvalidHeaderDeserialization");
  EXPECT_EQ(code_of(file_of("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", std::string(4, '\0'))),
            "InvalidHeaderDeserialization");
  EXPECT_EQ(code_of(file_of("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", std::string(4, '\0'))),
            "InvalidHeaderDeserialization");
  EXPECT_EQ(code_of(file_of("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", std::string(4, '\0'))),
            "InvalidHeaderDeserialization");
  EXPECT_EQ(code_of(file_of("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4]}}", std::string(4, '\0'))),
            "InvalidHeaderDeserialization");
  EXPECT_EQ(code_of(file_of("{\"a\":{\"dtype\":\"F32\",\"shape\":[[1]],\"data_offsets\":[0,4]}}", std::string(4, '\0'))),
            "InvalidHeaderDeserialization");
  EXPECT_EQ(code_of(file_of("{\"a\":{\"dtype\":5,\"shape\":[1],\"data_offsets\":[0,4]}}", std::string(4, '\0'))),
            "InvalidHeaderDeserialization");
  EXPECT_EQ(code_of(file_of("{\"a\":[]}", "")), "InvalidHeaderDeserialization");
  EXPECT_EQ(code_of(file_of("{\"a\":null}", "")), "InvalidHeaderDeserialization");
}

TEST(SafetensorsHeader, ValidEdgeCases) {
  // Empty header; zero-size tensors sharing an offset; rank-0 scalar.
  EXPECT_EQ(code_of(file_of("{}", "")), "OK");
  std::string h = "{" + t("z1", "F32", "[0]", 0, 0) + "," + t("z2", "BF16", "[3,0]", 0, 0) + "," + t("s", "F64", "[]", 0, 8) + "," +
                  t("v", "U8", "[3]", 8, 11) + "}";
  auto r = parse(file_of(h, std::string(11, '\x01')));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->tensors.size(), 4u);
  EXPECT_EQ(r->data_size, 11u);
  EXPECT_EQ(r->tensors[2].name, "s");
  EXPECT_TRUE(r->tensors[2].shape.empty());
  auto m = parse(file_of("{\"__metadata__\":{\"format\":\"pt\",\"x\":\"\\u00e9\\n\"}}", ""));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->metadata.at("x"), "\xc3\xa9\n");
}

TEST(SafetensorsHeader, GoldenEmpty) {
  // Reference test_empty: serialize(&{}, &None) == [8,0,0,0,0,0,0,0,'{','}',' ' x 6].
  std::vector<TensorEntry> none;
  auto h = build_header(none, nullptr);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(le64(h->size()) + *h, std::string("\x08\0\0\0\0\0\0\0{}      ", 16));
}

TEST(SafetensorsHeader, GoldenSerialization) {
  // Reference test_serialization: one F32 tensor "attn.0" of shape [1,2,3] (N = 64).
  std::vector<TensorEntry> e = {{"attn.0", DType::kF32, {1, 2, 3}, 0, 0}};
  auto h = build_header(e, nullptr);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->size(), 64u);
  EXPECT_EQ(*h, std::string("{\"attn.0\":{\"dtype\":\"F32\",\"shape\":[1,2,3],\"data_offsets\":[0,24]}}"));
}

TEST(SafetensorsHeader, WriteOrderIsDTypeRankThenName) {
  std::vector<TensorEntry> e = {{"b", DType::kU8, {1}, 0, 0},   {"a", DType::kBF16, {1}, 0, 0}, {"c", DType::kF16, {1}, 0, 0},
                                {"d", DType::kF32, {1}, 0, 0},  {"e", DType::kF32, {1}, 0, 0},  {"f", DType::kI64, {1}, 0, 0},
                                {"g", DType::kBool, {1}, 0, 0}, {"h", DType::kF8E4M3, {1}, 0, 0}, {"i", DType::kF8E5M2, {1}, 0, 0}};
  std::map<std::string, std::string> md = {{"z", "1"}, {"format", "pt"}};
  auto h = build_header(e, &md);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  std::string order;
  for (const auto& x : e) order += x.name;
  EXPECT_EQ(order, "fdeachibg");
  EXPECT_EQ(h->rfind("{\"__metadata__\":{\"format\":\"pt\",\"z\":\"1\"},\"f\":", 0), 0u) << *h;
  EXPECT_EQ(h->size() % 8, 0u);
  // Every tensor begins at a multiple of its element size in the file.
  for (const auto& x : e) EXPECT_EQ((8 + h->size() + x.begin) % dtype_size(x.dtype), 0u) << x.name;
}

TEST(SafetensorsHeader, JsonQuote) {
  EXPECT_EQ(json_quote("a\"b\\c\n\x01\xc3\xa9/"), "\"a\\\"b\\\\c\\n\\u0001\xc3\xa9/\"");
}

}  // namespace
}  // namespace ckpt::safetensors
