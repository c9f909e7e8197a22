#include "common/drafters/ngram_calibration.h"

#include <algorithm>

namespace specula {

int32_t NgramCalibration::ClassOf(int64_t match) {
  if (match <= 1) return 0;
  if (match == 2) return 1;
  if (match <= 4) return 2;
  if (match < kLongMatch) return 3;
  return 4;
}

void NgramCalibration::Record(int32_t cls, int32_t j, bool accepted) {
  if (cls < 0 || cls >= kClasses || j < 1) return;
  j = std::min(j, kDepth);
  double& trials = trials_[cls][j];
  double& hits = hits_[cls][j];
  trials += 1;
  if (accepted) hits += 1;
  if (trials >= kWindow) {
    trials /= 2;
    hits /= 2;
  }
}

double NgramCalibration::Conditional(int32_t cls, int32_t j) const {
  cls = std::clamp(cls, 0, kClasses - 1);
  j = std::clamp(j, 1, kDepth);
  double all_trials = 1, all_hits = 0.5;  // 1/2 until measured
  for (int32_t c = 0; c < kClasses; ++c) {
    all_trials += trials_[c][j];
    all_hits += hits_[c][j];
  }
  const double prior = all_hits / all_trials;
  return (hits_[cls][j] + kPriorWeight * prior) / (trials_[cls][j] + kPriorWeight);
}

int32_t NgramCalibration::Keep(int32_t cls, int32_t len, double min_reach) const {
  if (min_reach <= 0) return std::max(len, 0);
  double reach = 1;
  for (int32_t j = 1; j <= len; ++j) {
    reach *= Conditional(cls, j);
    if (reach < min_reach) return j - 1;
  }
  return std::max(len, 0);
}

}  // namespace specula
