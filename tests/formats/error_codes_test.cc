// formats/base/error_codes: one kind per rule code, every code the sources use is in the table, and a
// Status survives the trip through JSON (pipe, MPI) with its kind checked against the table.
#include "formats/base/error_codes.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "formats/base/status.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;

TEST(ErrorCodes, EachCodeOnce) {
  size_t n = 0;
  const ErrorCodeEntry* t = error_code_table(&n);
  ASSERT_GT(n, 50u);
  std::set<std::string> seen;
  for (size_t i = 0; i < n; ++i) EXPECT_TRUE(seen.insert(t[i].code).second) << t[i].code << " listed twice";
}

TEST(ErrorCodes, ErrorTakesTheKindFromTheTable) {
  EXPECT_EQ(Status::Error("ShapeMismatch", "m").kind(), ErrorKind::kCorruption);
  EXPECT_EQ(Status::Error("UnknownTensor", "m").kind(), ErrorKind::kCorruption);
  EXPECT_EQ(Status::Error("LayoutRefused", "m").kind(), ErrorKind::kInvalidArgument);
  EXPECT_EQ(Status::Error("ChecksumMismatch", "m").kind(), ErrorKind::kChecksum);
  EXPECT_EQ(Status::Error("CastOverflow", "m").kind(), ErrorKind::kOverflow);
  Status s = Status::Error("NoSuchCode", "m");
  EXPECT_EQ(s.kind(), ErrorKind::kInternal);
  EXPECT_EQ(s.code(), "NoSuchCode");
  EXPECT_NE(s.message().find("no entry in formats/base/error_codes.cc"), std::string::npos);
}

// Every literal code passed to Status::Error, or to a helper named err/bad/fail that forwards
// one, in the library sources is listed in the table (else it would report as an internal error).
TEST(ErrorCodes, EveryCodeUsedInTheSourcesIsListed) {
  const std::regex call(R"((?:Status::Error|\berr|\bbad)\(\s*"([A-Za-z0-9]+)\")");
  size_t found = 0;
  for (const char* layer : {"formats", "reshard", "converters", "trainer", "cli"}) {
    for (const auto& e : fs::recursive_directory_iterator(fs::path(CKPT_SOURCE_DIR) / layer)) {
      if (e.path().extension() != ".cc" && e.path().extension() != ".h") continue;
      std::ifstream f(e.path());
      std::stringstream ss;
      ss << f.rdbuf();
      const std::string text = ss.str();
      for (std::sregex_iterator it(text.begin(), text.end(), call), end; it != end; ++it) {
        ++found;
        EXPECT_TRUE(kind_of_code((*it)[1].str()).has_value()) << (*it)[1].str() << " in " << e.path();
      }
    }
  }
  EXPECT_GT(found, 100u);
}

TEST(StatusJson, RoundTrip) {
  EXPECT_TRUE(Status::from_json(Status::Ok().to_json()).ok());
  Status s = Status::Error("PieceOverlap", "pieces \"1\" and 2\nmeet").with_file("a/b.h5").with_tensor("w\xc3\xa9");
  Status back = Status::from_json(s.to_json());
  EXPECT_EQ(back.to_string(), s.to_string());
  EXPECT_EQ(back.kind(), ErrorKind::kCorruption);
  EXPECT_EQ(back.file(), "a/b.h5");
  EXPECT_EQ(back.tensor(), "w\xc3\xa9");
  Status io = Status::FromErrno("cannot open", "/x", ENOENT);
  EXPECT_EQ(Status::from_json(io.to_json()).to_string(), io.to_string());
  // Bytes that are not UTF-8 in a message still make valid JSON.
  EXPECT_EQ(Status::from_json(Status::Io("bad \xff byte").to_json()).kind(), ErrorKind::kIo);
}

TEST(StatusJson, WhatTheTableDoesNotSayBecomesInternal) {
  for (const std::string& wire : {
           std::string(R"({"kind":"corruption","code":"ShapeMismatchX","message":"m"})"),  // unknown code
           std::string(R"({"kind":"mismatch","code":"ShapeMismatch","message":"m"})"),     // kind differs from the table
           std::string(R"({"kind":"sideways","code":"Io","message":"m"})"),                // unknown kind
           std::string(R"({"code":"Io"})"),                                                 // no kind
           std::string("[1]"),
           std::string("not json"),
           std::string(""),
       }) {
    Status s = Status::from_json(wire);
    EXPECT_FALSE(s.ok()) << wire;
    EXPECT_EQ(s.kind(), ErrorKind::kInternal) << wire;
    EXPECT_NE(s.message().find("another process"), std::string::npos) << s.message();
  }
}

}  // namespace
}  // namespace ckpt
