// Token sampling: greedy, temperature, top-k, top-p, with a per-sequence seeded RNG.
//
// Torch-free and deterministic: works on one row of float32 logits on the host, so the same seed
// gives the same tokens whatever device computed the logits. The speculative verifiers reuse
// Probabilities() so that draft and target distributions are processed identically.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "common/util/status.h"

namespace specula {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy
  int32_t top_k = 0;         // 0 = off
  float top_p = 1.0f;        // 1 = off
  uint64_t seed = 0;

  bool greedy() const { return temperature <= 0.0f; }
  // INVALID_ARGUMENT naming the field: temperature < 0, top_k < 0, top_p outside (0, 1].
  Status Validate() const;
};

// Per-sequence random stream (64-bit Mersenne Twister seeded from SamplingParams::seed).
class SequenceRng {
 public:
  explicit SequenceRng(uint64_t seed) : engine_(seed) {}
  double Uniform();  // [0, 1)

 private:
  std::mt19937_64 engine_;
};

// Index of the largest logit (lowest index on ties).
int32_t Argmax(std::span<const float> logits);

// The distribution a request samples from: softmax(logits / temperature) restricted to the top_k
// most likely tokens and then to the smallest set whose mass reaches top_p, renormalised. For
// greedy params: a one-hot at Argmax. Returns [vocab] probabilities.
std::vector<float> Probabilities(std::span<const float> logits, const SamplingParams& params);

// Draws an index from probabilities (need not sum exactly to 1).
int32_t SampleFrom(std::span<const float> probs, SequenceRng& rng);

// Probabilities + SampleFrom, or Argmax when greedy.
int32_t SampleToken(std::span<const float> logits, const SamplingParams& params, SequenceRng& rng);

}  // namespace specula
