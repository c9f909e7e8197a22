#include "common/drafters/draft_sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/model/cpu_kernels.h"

namespace specula {
namespace {

// Mixed into the request's seed so the drafter's random stream is independent of the target's.
constexpr uint64_t kSeedSalt = 0xD1B54A32D192ED03ull;

}  // namespace

uint64_t DraftSeed(uint64_t seed) {
  uint64_t x = seed ^ kSeedSalt;  // splitmix64
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::vector<float> Softmax(std::span<const float> row) {
  std::vector<float> probs(row.size(), 0.0f);
  if (row.empty()) return probs;
  const float max_logit = row[Argmax(row)];
  const float total =
      ExpBelowRaw(row.data(), static_cast<int64_t>(row.size()), max_logit, probs.data());
  const float inv = 1.0f / total;
  for (float& p : probs) p *= inv;
  return probs;
}

TopToken ArgmaxWithProbability(std::span<const float> row) {
  if (row.empty()) return {};
  const int32_t token = Argmax(row);
  return {token, 1.0f / SumExpBelow(row.data(), static_cast<int64_t>(row.size()), row[token])};
}

std::vector<float> DraftProbabilities(std::span<const float> row, const SamplingParams& sampling) {
  return sampling.greedy() ? Softmax(row) : Probabilities(row, sampling);
}

std::vector<int32_t> TopTokens(std::span<const float> row, int32_t w) {
  std::vector<int32_t> order(row.size());
  std::iota(order.begin(), order.end(), 0);
  const size_t k = std::min(order.size(), static_cast<size_t>(std::max(w, 0)));
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return row[a] > row[b] || (row[a] == row[b] && a < b);
  });
  order.resize(k);
  return order;
}

}  // namespace specula
