// Helpers every model-based drafter shares to turn logits into candidates: the drafter's own
// random stream, the probabilities it ranks and reports with, and top-token selection. Torch-free.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/sampling/sampler.h"

namespace specula {

// The drafter's seed for a request seed: salted (splitmix64), so the drafter's random stream is
// independent of the target's.
uint64_t DraftSeed(uint64_t seed);

// softmax(row): lane-parallel float exponentials and sums (ExpBelowRaw, ~1e-6 relative). Entries
// at -inf (outside a draft vocabulary) get exactly 0.
std::vector<float> Softmax(std::span<const float> row);

// A greedy chain's next node: the row's argmax (ties to the lower id) and its softmax probability,
// 1 / sum(exp(l - max)), without the other tokens' probabilities. A draft LM's greedy chain made
// the whole softmax of a 4,096-entry row per node: a tenth of its drafting time (perf, CPU).
struct TopToken {
  int32_t token = 0;
  float prob = 0.0f;
};
TopToken ArgmaxWithProbability(std::span<const float> row);

// The draft distribution of a request: the target's shaping (temperature, top-k, top-p) for
// sampled requests, plain softmax for greedy ones (whose shaped distribution is a one-hot).
std::vector<float> DraftProbabilities(std::span<const float> row, const SamplingParams& sampling);

// The `w` tokens with the largest values, best first (ties to the lower id, like Argmax).
std::vector<int32_t> TopTokens(std::span<const float> row, int32_t w);

}  // namespace specula
