#include "common/spec/step_gap_tail.h"

#include <algorithm>
#include <cmath>

namespace specula {

void StepGapTail::Add(double wall, double predicted, double no_draft_predicted, int32_t gaps,
                      int32_t accepted, bool prompt_chunks) {
  if (gaps <= 0 || !(wall > 0) || !(predicted > 0) || !(no_draft_predicted > 0) ||
      !std::isfinite(wall) || !std::isfinite(predicted) || !std::isfinite(no_draft_predicted)) {
    return;
  }
  const double residual = wall - predicted;
  const double plain = no_draft_predicted + residual;
  if (!prompt_chunks) last_decode_plain_ = plain;
  const Sample sample{.plain = plain,
                      .residual = residual,
                      .gaps = gaps,
                      .accepted_plain = last_decode_plain_ > 0 ? last_decode_plain_ : plain,
                      .accepted = std::max(accepted, 0)};
  if (samples_.size() < static_cast<size_t>(kWindow)) {
    samples_.push_back(sample);
  } else {
    samples_[next_] = sample;
  }
  next_ = (next_ + 1) % kWindow;
  ++stale_;
}

double StepGapTail::Quantile(bool plain, double q) const {
  scratch_.clear();
  int64_t total = 0;
  for (const Sample& s : samples_) {
    scratch_.emplace_back(plain ? s.plain : s.residual, s.gaps);
    total += s.gaps;
    if (plain && s.accepted > 0) {
      scratch_.emplace_back(s.accepted_plain, s.accepted);
      total += s.accepted;
    }
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
  plain_q_ = Quantile(/*plain=*/true, kGapQuantile);
  residual_q_ = Quantile(/*plain=*/false, kResidualQuantile);
  stale_ = 0;
  computed_ = true;
}

}  // namespace specula
