// The progress bar every long command draws on stderr: "LABEL [#####.....]  45%  1.20 GiB /
// 2.70 GiB  812 MB/s", redrawn in place (formats/base/progress_line.h: erase to end of line, at most
// every 100 ms, a final newline). Drawn only when enabled (stderr is a terminal and the output
// is not --json); libraries report through callback(). Thread safety: one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "formats/base/progress_line.h"

namespace ckpt::cli {

class ProgressBar {
 public:
  ProgressBar(std::string label, bool enabled);
  ~ProgressBar() { finish(); }
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // (bytes done, total); done >= total draws the final line.
  void update(uint64_t done, uint64_t total);
  // Ends a line left unfinished (call before printing anything else, e.g. an error).
  void finish();
  // A callback for a library's progress parameter that updates this bar; empty when disabled.
  std::function<void(uint64_t, uint64_t)> callback();

 private:
  std::string label_;
  bool enabled_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  ProgressLine line_;
};

}  // namespace ckpt::cli
