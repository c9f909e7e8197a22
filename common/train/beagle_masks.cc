#include "common/train/beagle_masks.h"

#include <cstddef>

namespace specula {

BeagleWindow BeagleWindowOf(int64_t p, int64_t k, int64_t eps) {
  // n_w = largest eps + w * k below p.
  const int64_t r = ((p - 1 - eps) % k + k) % k;
  const int64_t start = p - 1 - r;
  return {.start = start, .index = p - start};
}

std::vector<uint8_t> BeagleEarlyMask(int64_t T, int64_t k, int64_t eps) {
  std::vector<uint8_t> mask(static_cast<size_t>(T * T), 0);
  for (int64_t p = 0; p < T; ++p) {
    const int64_t last = BeagleWindowOf(p, k, eps).start;
    for (int64_t j = 0; j <= last && j < T; ++j) mask[p * T + j] = 1;
  }
  return mask;
}

std::vector<uint8_t> BeagleLateMask(int64_t T, int64_t k, int64_t eps, int64_t step) {
  std::vector<uint8_t> mask(static_cast<size_t>(T * 2 * T), 0);
  for (int64_t p = 0; p < T; ++p) {
    const BeagleWindow w = BeagleWindowOf(p, k, eps);
    if (w.index != step || w.start < 0) continue;
    uint8_t* row = &mask[p * 2 * T];
    for (int64_t j = 0; j <= w.start; ++j) row[j] = 1;
    for (int64_t j = w.start + 1; j < p; ++j) row[T + j] = 1;
  }
  return mask;
}

std::vector<int64_t> BeagleStepQueries(int64_t T, int64_t k, int64_t eps, int64_t step) {
  std::vector<int64_t> out;
  for (int64_t p = 0; p < T; ++p) {
    const BeagleWindow w = BeagleWindowOf(p, k, eps);
    if (w.index == step && w.start >= 0) out.push_back(p);
  }
  return out;
}

}  // namespace specula
