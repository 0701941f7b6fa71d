// ProgressLine: what a terminal shows after its redraws. The oracle is a tiny terminal written
// here (carriage return, newline, erase-to-end-of-line, overwrite at the cursor), not the
// production code: a shorter redraw must leave none of a longer one ("252 MB/ss" was seen).
#include "formats/base/progress_line.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ckpt {
namespace {

using namespace std::chrono_literals;

// Lines on screen after `bytes`: "\r" to column 0, "\n" to a new line, "\x1b[K" erases from the
// cursor to the end of the line, any other byte overwrites the cell under the cursor.
std::vector<std::string> screen(const std::string& bytes) {
  std::vector<std::string> lines(1);
  size_t col = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string& line = lines.back();
    if (bytes.compare(i, 3, "\x1b[K") == 0) {
      line.resize(std::min(line.size(), col));
      i += 2;
    } else if (bytes[i] == '\r') {
      col = 0;
    } else if (bytes[i] == '\n') {
      lines.emplace_back();
      col = 0;
    } else {
      if (col < line.size()) line[col] = bytes[i];
      else line.push_back(bytes[i]);
      ++col;
    }
  }
  return lines;
}

TEST(ProgressLine, ShorterRedrawLeavesNoStaleCharacters) {
  ProgressLine pl(0ms);
  const auto t0 = ProgressLine::Clock::now();
  std::string out = pl.redraw("reshard [###...]  40%  1.20/3.00 GiB  1252 MB/s", false, t0);
  out += pl.redraw("reshard [####..]  50%  1.50/3.00 GiB  252 MB/s", false, t0 + 1s);
  EXPECT_EQ(screen(out), std::vector<std::string>{"reshard [####..]  50%  1.50/3.00 GiB  252 MB/s"});
  out += pl.redraw("done", true, t0 + 2s);
  EXPECT_EQ(screen(out), (std::vector<std::string>{"done", ""}));
}

TEST(ProgressLine, RateLimitedFinalAlwaysDrawnAndEndsTheLine) {
  ProgressLine pl(100ms);
  const auto t0 = ProgressLine::Clock::now();
  EXPECT_FALSE(pl.redraw("a", false, t0).empty());      // the first one is drawn
  EXPECT_EQ(pl.redraw("b", false, t0 + 50ms), "");      // too soon
  EXPECT_FALSE(pl.redraw("c", false, t0 + 150ms).empty());
  const std::string fin = pl.redraw("d", true, t0 + 151ms);  // final: drawn however soon
  EXPECT_EQ(screen(fin).front(), "d");
  EXPECT_EQ(fin.back(), '\n');
  EXPECT_EQ(pl.redraw("e", false, t0 + 1s), "");        // the line has ended
  EXPECT_EQ(pl.finish(), "");
}

TEST(ProgressLine, FinishEndsAnUnfinishedLineOnly) {
  ProgressLine never;
  EXPECT_EQ(never.finish(), "");  // nothing drawn: nothing to end
  ProgressLine cut;
  std::string out = cut.redraw("verify 10%", false);
  out += cut.finish();
  out += "ckpt: error";
  EXPECT_EQ(screen(out), (std::vector<std::string>{"verify 10%", "ckpt: error"}));
  EXPECT_EQ(cut.finish(), "");
}

}  // namespace
}  // namespace ckpt
