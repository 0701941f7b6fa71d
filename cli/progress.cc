#include "cli/progress.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "formats/base/byte_size.h"

namespace ckpt::cli {

ProgressBar::ProgressBar(std::string label, bool enabled) : label_(std::move(label)), enabled_(enabled) {}

void ProgressBar::update(uint64_t done, uint64_t total) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  const double frac = total ? static_cast<double>(std::min(done, total)) / static_cast<double>(total) : 1.0;
  const int width = 30, fill = static_cast<int>(frac * width);
  const double secs = std::chrono::duration<double>(now - start_).count();
  char tail[64];
  std::snprintf(tail, sizeof tail, "  %.0f MB/s", secs > 0 ? static_cast<double>(done) / 1e6 / secs : 0.0);
  char pct[16];
  std::snprintf(pct, sizeof pct, "%3d%%", static_cast<int>(frac * 100));
  const std::string text = label_ + " [" + std::string(static_cast<size_t>(fill), '#') +
                           std::string(static_cast<size_t>(width - fill), '.') + "] " + pct + "  " + human_bytes(done) +
                           " / " + human_bytes(total) + tail;
  const std::string out = line_.redraw(text, done >= total, now);
  if (out.empty()) return;
  std::fputs(out.c_str(), stderr);
  std::fflush(stderr);
}

void ProgressBar::finish() {
  const std::string out = line_.finish();
  if (out.empty()) return;
  std::fputs(out.c_str(), stderr);
  std::fflush(stderr);
}

std::function<void(uint64_t, uint64_t)> ProgressBar::callback() {
  if (!enabled_) return {};
  return [this](uint64_t done, uint64_t total) { update(done, total); };
}

}  // namespace ckpt::cli
