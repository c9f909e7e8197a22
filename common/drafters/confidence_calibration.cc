#include "common/drafters/confidence_calibration.h"

#include <algorithm>
#include <cmath>

namespace specula {
namespace {

// Upper edges of the bins but the last; finer near 1, where most of a good drafter's nodes are.
constexpr std::array<double, ConfidenceCalibration::kBins - 1> kEdges = {
    0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99};

double Middle(int32_t bin) {
  const double lo = bin == 0 ? 0.0 : kEdges[bin - 1];
  const double hi = bin == ConfidenceCalibration::kBins - 1 ? 1.0 : kEdges[bin];
  return (lo + hi) / 2;
}

}  // namespace

int32_t ConfidenceCalibration::BinOf(double prob) {
  if (!(prob > 0)) return 0;  // NaN too
  return static_cast<int32_t>(std::upper_bound(kEdges.begin(), kEdges.end(), prob) -
                              kEdges.begin());
}

void ConfidenceCalibration::Record(int32_t bin, bool accepted) {
  if (bin < 0 || bin >= kBins) return;
  trials_[bin] += 1;
  if (accepted) hits_[bin] += 1;
  if (trials_[bin] >= kWindow) {
    trials_[bin] /= 2;
    hits_[bin] /= 2;
  }
}

double ConfidenceCalibration::Conditional(int32_t bin) const {
  bin = std::clamp(bin, 0, kBins - 1);
  return (hits_[bin] + kPriorWeight * Middle(bin)) / (trials_[bin] + kPriorWeight);
}

double ConfidenceCalibration::Average() const {
  double trials = 1, hits = 0.5;
  for (int32_t b = 0; b < kBins; ++b) {
    trials += trials_[b];
    hits += hits_[b];
  }
  return hits / trials;
}

}  // namespace specula
