#include "common/train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace specula {

double LrSchedule::At(int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps)
    return peak_lr * double(step + 1) / double(warmup_steps);
  if (inverse_sqrt)
    return peak_lr * std::sqrt(double(std::max<int64_t>(warmup_steps, 1)) / double(step + 1));
  const int64_t decay = std::max<int64_t>(1, total_steps - warmup_steps);
  const double progress = std::clamp(double(step - warmup_steps) / double(decay), 0.0, 1.0);
  return min_lr + 0.5 * (peak_lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace specula
