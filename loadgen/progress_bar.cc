#include "loadgen/progress_bar.h"

#include <unistd.h>

#include <algorithm>

namespace specula::loadgen {
namespace {

std::string Clock(double s) {
  const int64_t t = static_cast<int64_t>(s);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%02lld:%02lld", static_cast<long long>(t / 60),
                static_cast<long long>(t % 60));
  return buf;
}

}  // namespace

ProgressBar::ProgressBar(std::FILE* out, std::string label, int64_t total)
    : out_(out), label_(std::move(label)), total_(total) {
  start_ = last_draw_ = std::chrono::steady_clock::now();
  Draw(false);
}

ProgressBar::~ProgressBar() { Finish(); }

bool ProgressBar::Enabled(bool disable, bool force) {
  if (disable) return false;
  return force || isatty(STDERR_FILENO) == 1;
}

std::string ProgressBar::Render(const std::string& label, int64_t done, int64_t total,
                                double elapsed_s) {
  constexpr int kWidth = 24;
  const double frac = total > 0 ? std::min(1.0, static_cast<double>(done) / total) : 1.0;
  const int filled = static_cast<int>(frac * kWidth);
  const double rate = elapsed_s > 0 ? done / elapsed_s : 0;
  const double left = rate > 0 ? static_cast<double>(total - done) / rate : 0;
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%s %3d%%|%s%s| %lld/%lld [%s<%s, %.2f req/s]", label.c_str(),
                static_cast<int>(frac * 100), std::string(filled, '#').c_str(),
                std::string(kWidth - filled, ' ').c_str(), static_cast<long long>(done),
                static_cast<long long>(total), Clock(elapsed_s).c_str(), Clock(left).c_str(), rate);
  return buf;
}

void ProgressBar::Add(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  done_ += n;
  Draw(false);
}

void ProgressBar::Finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  Draw(true);
  finished_ = true;
}

void ProgressBar::Draw(bool final) {
  const auto now = std::chrono::steady_clock::now();
  if (!final && done_ < total_ && now - last_draw_ < std::chrono::milliseconds(100) && done_ > 0) {
    return;
  }
  last_draw_ = now;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  // \r (and on a terminal clear-to-end-of-line): redraw in place.
  std::fprintf(out_, "\r%s%s%s", Render(label_, done_, total_, elapsed).c_str(),
               isatty(fileno(out_)) == 1 ? "\033[K" : "", final ? "\n" : "");
  std::fflush(out_);
}

}  // namespace specula::loadgen
