#include "common/train/glancing.h"

#include <algorithm>
#include <cmath>

namespace specula {

std::vector<int64_t> GlancingReveal(const std::vector<int64_t>& predicted,
                                    const std::vector<int64_t>& gold, double ratio,
                                    std::mt19937_64& rng) {
  std::vector<int64_t> revealed(gold.size(), -1);
  std::vector<size_t> wrong;
  for (size_t j = 0; j < gold.size() && j < predicted.size(); ++j) {
    if (gold[j] >= 0 && predicted[j] != gold[j]) wrong.push_back(j);
  }
  const double r = std::clamp(ratio, 0.0, 1.0);
  const size_t n = std::min(wrong.size(), static_cast<size_t>(std::lround(r * wrong.size())));
  std::shuffle(wrong.begin(), wrong.end(), rng);
  for (size_t i = 0; i < n; ++i) revealed[wrong[i]] = gold[wrong[i]];
  return revealed;
}

double GlancingRatio(double start, int64_t step, int64_t total) {
  if (total <= 1) return start;
  const double progress = std::clamp(double(step) / double(total - 1), 0.0, 1.0);
  return start * (1.0 - progress);
}

}  // namespace specula
