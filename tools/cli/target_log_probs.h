// The target's log-probability of generated tokens: how likely the target itself finds an output
// (the quality figure `specula bench` reports next to a lossy rule's speed).
#pragma once

#include <cstdint>
#include <vector>

#include "common/model/model_runner.h"
#include "common/util/status.h"

namespace specula::cli {

struct LogProbSum {
  double sum = 0;      // sum of log p_target(token | prompt, earlier output), temperature 1
  int64_t tokens = 0;  // generated tokens scored
  double mean() const { return tokens ? sum / static_cast<double>(tokens) : 0; }
};

// Scores every outputs[i] after prompts[i] with one forward per group of `batch` sequences (in
// sequences of the runner's own, released afterwards). Empty outputs add nothing. The runner
// must be idle (no engine stepping it meanwhile).
StatusOr<LogProbSum> TargetLogProbs(ModelRunner& runner,
                                    const std::vector<std::vector<int32_t>>& prompts,
                                    const std::vector<std::vector<int32_t>>& outputs,
                                    int64_t batch = 16);

}  // namespace specula::cli
