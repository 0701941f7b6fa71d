// formats/base/json_read: the bounded JSON reader's four rules (size, depth, duplicate keys, syntax),
// each with its code, the position or path in the message, and the limits exactly at the edge.
#include "formats/base/json_read.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include "tests/temp_dir.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;

std::string nested(int depth) { return std::string(static_cast<size_t>(depth), '[') + std::string(static_cast<size_t>(depth), ']'); }

TEST(JsonRead, ParsesValidJson) {
  auto j = parse_json(R"({"a":[1,2,{"b":null}],"c":"d","e":-1.5,"f":18446744073709551615,"g":true})", {}, "t");
  ASSERT_TRUE(j.ok()) << j.status().to_string();
  EXPECT_EQ(*j, nlohmann::json::parse(R"({"a":[1,2,{"b":null}],"c":"d","e":-1.5,"f":18446744073709551615,"g":true})"));
  EXPECT_EQ((*j)["f"].get<uint64_t>(), UINT64_MAX);
  auto s = parse_json("\"x\"", {}, "t");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, "x");
}

TEST(JsonRead, DepthLimitIsExact) {
  JsonLimits lim;
  lim.max_depth = 5;
  EXPECT_TRUE(parse_json(nested(5), lim, "t").ok());
  auto r = parse_json(nested(6), lim, "t");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), "JsonTooDeep");
  EXPECT_EQ(r.status().kind(), ErrorKind::kCorruption);
  EXPECT_NE(r.status().message().find("(byte 5)"), std::string::npos) << r.status().message();
  // Objects count too, and brackets inside strings do not.
  EXPECT_TRUE(parse_json(R"({"a":{"b":{"c":{"d":["[[[[[[[["]}}}})", lim, "t").ok());
  r = parse_json(R"({"[[":{"b":{"c":{"d":{"e":{}}}}}})", lim, "t");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), "JsonTooDeep");
  EXPECT_NE(r.status().message().find("(byte 26)"), std::string::npos) << r.status().message();
}

TEST(JsonRead, HostileNestingIsRefusedWithoutBuilding) {
  // A hostile manifest: an array nested 200,000 deep (a recursive parser overflows its stack).
  auto r = parse_json("{\"format\":" + nested(200000) + "}", kManifestJsonLimits, "manifest");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), "JsonTooDeep");
  EXPECT_NE(r.status().message().find("manifest"), std::string::npos);
}

TEST(JsonRead, DuplicateKeysAreRefusedAtAnyDepth) {
  auto r = parse_json(R"({"a":1,"a":1})", {}, "t");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), "DuplicateKey");
  r = parse_json(R"({"x":[0,{"w":{"k":1,"j":2,"k":3}}]})", {}, "t");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), "DuplicateKey");
  EXPECT_NE(r.status().message().find("/x/1/w/k"), std::string::npos) << r.status().message();
  // The same key in sibling objects is fine.
  EXPECT_TRUE(parse_json(R"({"a":{"k":1},"b":{"k":1},"c":[{"k":1},{"k":2}]})", {}, "t").ok());
}

TEST(JsonRead, SizeLimitIsExact) {
  JsonLimits lim;
  lim.max_bytes = 8;
  EXPECT_TRUE(parse_json("[1,2,34]", lim, "t").ok());
  auto r = parse_json("[1,2,345]", lim, "t");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), "JsonTooLarge");
}

TEST(JsonRead, SyntaxErrorsNameThePosition) {
  for (std::string bad : {"", "{", "{\"a\":}", "[1,]", "{} {}", "{}x", "nul", "\"\xff\"", "{\"a\":1,}", "[1] // c"}) {
    auto r = parse_json(bad, {}, "thing");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), "InvalidJson") << bad;
    EXPECT_EQ(r.status().message().rfind("thing: ", 0), 0u) << r.status().message();
  }
  auto r = parse_json("[1,2,x]", {}, "t");
  EXPECT_NE(r.status().message().find("(byte "), std::string::npos) << r.status().message();
  // A NUL byte ends nlohmann's input early: refused before parsing.
  r = parse_json(std::string("{}\0{", 4), {}, "t");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), "InvalidJson");
  EXPECT_NE(r.status().message().find("NUL byte at byte 2"), std::string::npos) << r.status().message();
}

class JsonFile : public ckpt::testing::TempDirTest {
 protected:
  const fs::path& dir_ = root_;
};

TEST_F(JsonFile, ReadsAndNamesTheFile) {
  const fs::path p = dir_ / "x.json";
  std::ofstream(p) << R"({"a":1,"a":2})";
  auto r = read_json_file(p.string(), {}, "config");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), "DuplicateKey");
  EXPECT_EQ(r.status().file(), p.string());
  std::ofstream(p, std::ios::trunc) << R"({"a":1})";
  r = read_json_file(p.string(), {}, "config");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)["a"], 1);
}

TEST_F(JsonFile, HugeFileIsRefusedUnread) {
  const fs::path p = dir_ / "huge.json";
  std::ofstream(p) << "[]";
  fs::resize_file(p, (uint64_t{1} << 40));  // sparse: a 1 TiB file that would take hours to read
  auto r = read_json_file(p.string(), kManifestJsonLimits, "manifest");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), "JsonTooLarge");
  EXPECT_EQ(r.status().file(), p.string());
}

TEST_F(JsonFile, MissingFileAndDirectory) {
  auto r = read_json_file((dir_ / "nope.json").string(), {}, "layout file");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().kind(), ErrorKind::kNotFound);
  r = read_json_file(dir_.string(), {}, "layout file");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), "InvalidJson");
}

}  // namespace
}  // namespace ckpt
