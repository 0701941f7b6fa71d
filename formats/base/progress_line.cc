#include "formats/base/progress_line.h"

namespace ckpt {

std::string ProgressLine::redraw(const std::string& text, bool final, Clock::time_point now) {
  if (ended_) return "";
  if (!final && drawn_ && now - last_ < interval_) return "";
  last_ = now;
  drawn_ = true;
  ended_ = final;
  return "\r" + text + "\x1b[K" + (final ? "\n" : "");
}

std::string ProgressLine::finish() {
  if (!drawn_ || ended_) return "";
  ended_ = true;
  return "\n";
}

}  // namespace ckpt
