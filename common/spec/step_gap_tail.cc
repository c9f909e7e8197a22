#include "common/spec/step_gap_tail.h"

#include <algorithm>
#include <cmath>

namespace specula {

void StepGapTail::Add(double wall, double predicted, double no_draft_predicted, int32_t gaps) {
  if (gaps <= 0 || !(wall > 0) || !(predicted > 0) || !(no_draft_predicted > 0) ||
      !std::isfinite(wall) || !std::isfinite(predicted) || !std::isfinite(no_draft_predicted)) {
    return;
  }
  const double residual = wall - predicted;
  const Sample sample{.plain = no_draft_predicted + residual, .residual = residual, .gaps = gaps};
  if (samples_.size() < static_cast<size_t>(kWindow)) {
    samples_.push_back(sample);
  } else {
    samples_[next_] = sample;
  }
  next_ = (next_ + 1) % kWindow;
  ++stale_;
}

double StepGapTail::Quantile(double Sample::*value, double q) const {
  scratch_.clear();
  int64_t total = 0;
  for (const Sample& s : samples_) {
    scratch_.emplace_back(s.*value, s.gaps);
    total += s.gaps;
  }
  std::sort(scratch_.begin(), scratch_.end());
  // The smallest value with at least q of the gaps at or below it.
  const double rank = q * static_cast<double>(total);
  int64_t below = 0;
  for (const auto& [v, gaps] : scratch_) {
    below += gaps;
    if (static_cast<double>(below) >= rank) return v;
  }
  return scratch_.back().first;
}

void StepGapTail::Refresh() const {
  if (!ready() || (computed_ && stale_ < kRecomputeEvery)) return;
  plain_q_ = Quantile(&Sample::plain, kGapQuantile);
  residual_q_ = Quantile(&Sample::residual, kResidualQuantile);
  stale_ = 0;
  computed_ = true;
}

}  // namespace specula
