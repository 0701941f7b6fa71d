// One status line redrawn in place on a terminal (the progress of a long command). Each redraw
// is "\r" + text + "\x1b[K": back to column 0, the text, then erase to the end of the line, so a
// shorter text leaves nothing of a longer one on screen. Redraws are rate-limited; the final one
// (and finish() after an unfinished line) ends the line with "\n". Pure: returns the bytes to
// write, the caller prints them (only cli/ prints). Thread safety: one thread per object.
#pragma once

#include <chrono>
#include <string>

namespace ckpt {

class ProgressLine {
 public:
  using Clock = std::chrono::steady_clock;
  explicit ProgressLine(std::chrono::milliseconds interval = std::chrono::milliseconds(100)) : interval_(interval) {}

  // Bytes that draw `text` at `now`; "" when the previous redraw is less than `interval` old and
  // this one is not `final`, or when the line has already ended.
  std::string redraw(const std::string& text, bool final, Clock::time_point now = Clock::now());
  // "\n" when a redraw is on screen and the line has not ended (an error cut it short), else "".
  std::string finish();

 private:
  std::chrono::milliseconds interval_;
  Clock::time_point last_{};
  bool drawn_ = false, ended_ = false;
};

}  // namespace ckpt
