// Observation rounds that take a hidden-state drafter's CPU forward (SpecFormerCpuForward,
// CpuForward's layer) through each of its paths, for tests that compare it with the module's:
// a catch-up of 50 rows over two sequences (more than kSmallMatmulMaxRows: the module's path),
// two batched steady rounds and a single row.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <random>
#include <vector>

#include "common/spec/drafter.h"

namespace specula {

// Sequences 1 and 2; `hidden_layers` random [rows, d] states per observation (0: token-only),
// tokens in [0, vocab).
inline std::vector<std::vector<DrafterObservation>> CpuForwardRounds(size_t hidden_layers,
                                                                     int64_t d, int32_t vocab) {
  torch::manual_seed(11);
  std::mt19937 rng(7);
  auto observation = [&](SeqId seq, int64_t tokens, int64_t rows) {
    DrafterObservation o{.seq = seq};
    for (int64_t i = 0; i < tokens; ++i) o.tokens.push_back(static_cast<int32_t>(rng() % vocab));
    for (size_t k = 0; k < hidden_layers; ++k) o.hidden.push_back(torch::randn({rows, d}));
    return o;
  };
  return {{observation(1, 12, 11), observation(2, 40, 39)},
          {observation(1, 3, 3), observation(2, 2, 2)},
          {observation(2, 4, 4), observation(1, 1, 1)},
          {observation(1, 1, 1)}};
}

}  // namespace specula
