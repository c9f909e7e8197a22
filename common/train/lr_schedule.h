// Learning rate: linear warmup to peak, then cosine decay to min_lr at total_steps, or (with
// inverse_sqrt, SpecDec's and fairseq's schedule) peak * sqrt(warmup_steps / (step + 1)).
#pragma once

#include <cstdint>

namespace specula {

struct LrSchedule {
  double peak_lr = 1e-3;
  double min_lr = 1e-4;
  int64_t warmup_steps = 100;
  int64_t total_steps = 1000;
  bool inverse_sqrt = false;  // min_lr is then unused

  double At(int64_t step) const;  // step is 0-based
};

}  // namespace specula
