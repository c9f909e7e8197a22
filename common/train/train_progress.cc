#include "common/train/train_progress.h"

#include <algorithm>
#include <cstdio>

#include "common/util/status.h"

namespace specula {

std::string FormatDuration(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%ldh%02ldm%02lds", s / 3600, (s / 60) % 60, s % 60);
  return buf;
}

std::string ProgressLine(int64_t done, int64_t total, std::string_view stage, double loss,
                         double lr, int64_t tokens_this_run, int64_t steps_this_run,
                         double elapsed_seconds) {
  const double eta = (total - done) * (elapsed_seconds / std::max<int64_t>(1, steps_this_run));
  const std::string stage_part = stage.empty() ? "" : StrCat(" | ", stage);
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "step %ld/%ld%s | loss %.4f | lr %.2e | %.0f tok/s | elapsed %s | ETA %s", done,
                total, stage_part.c_str(), loss, lr, tokens_this_run / elapsed_seconds,
                FormatDuration(elapsed_seconds).c_str(), FormatDuration(eta).c_str());
  return buf;
}

std::string FormatValues(const std::vector<double>& values) {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%s%.3f", i ? " " : "", values[i]);
    out += buf;
  }
  return out;
}

}  // namespace specula
