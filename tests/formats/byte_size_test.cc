// The one byte-size rule of every CLI flag, against hand-computed values.
#include "formats/base/byte_size.h"

#include <gtest/gtest.h>

namespace ckpt {
namespace {

TEST(ByteSize, BinaryAndDecimalUnits) {
  EXPECT_EQ(*parse_byte_size("1024", "--x"), 1024u);
  EXPECT_EQ(*parse_byte_size("64K", "--x"), 64u << 10);
  EXPECT_EQ(*parse_byte_size("512M", "--x"), 512ull << 20);
  EXPECT_EQ(*parse_byte_size("2g", "--x"), 2ull << 30);
  EXPECT_EQ(*parse_byte_size("2GiB", "--x"), 2ull << 30);
  EXPECT_EQ(*parse_byte_size("1tib", "--x"), 1ull << 40);
  EXPECT_EQ(*parse_byte_size("5GB", "--x"), 5000000000ull);
  EXPECT_EQ(*parse_byte_size("500mb", "--x"), 500000000ull);
  EXPECT_EQ(*parse_byte_size("10KB", "--x"), 10000u);
  EXPECT_EQ(*parse_byte_size("7B", "--x"), 7u);
}

TEST(ByteSize, RejectsWithTheFlagNamed) {
  for (const char* bad : {"", "GB", "0", "0M", "-5", "12X", "5XB", "1.5G", " 5G", "5G ",
                          "99999999999999999999G", "9999999999999G", "9223372036854775808"}) {
    auto r = parse_byte_size(bad, "--max-memory");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().kind(), ErrorKind::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("--max-memory"), std::string::npos) << r.status().message();
  }
}

}  // namespace
}  // namespace ckpt
