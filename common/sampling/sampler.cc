#include "common/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace specula {

Status SamplingParams::Validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) {
    return InvalidArgumentError(
        StrCat("temperature must be a finite number >= 0, got ", temperature));
  }
  if (top_k < 0) return InvalidArgumentError(StrCat("top_k must be >= 0, got ", top_k));
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return InvalidArgumentError(StrCat("top_p must be in (0, 1], got ", top_p));
  }
  return OkStatus();
}

double SequenceRng::Uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(engine_); }

int32_t Argmax(std::span<const float> logits) {
  // 16 lanes, each keeping its largest value and where it first saw it, so the loop vectorises
  // (std::max_element's compare-and-branch per logit was 16% of a draft LM's step over the
  // 4,096 logits of its depth); then the largest of the lanes, the lowest index among equals.
  constexpr int kLanes = 16;
  const float* x = logits.data();
  const auto n = static_cast<int64_t>(logits.size());
  if (n < 2 * kLanes) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  // As std::max_element: a NaN first stays the answer, a NaN later never is.
  if (std::isnan(x[0])) return 0;
  float best[kLanes];
  int32_t at[kLanes];
  for (int t = 0; t < kLanes; ++t) {
    best[t] = -std::numeric_limits<float>::infinity();
    at[t] = t;
  }
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int t = 0; t < kLanes; ++t) {
      const bool greater = x[i + t] > best[t];
      best[t] = greater ? x[i + t] : best[t];
      at[t] = greater ? static_cast<int32_t>(i + t) : at[t];
    }
  }
  float top = best[0];
  int32_t token = at[0];
  for (int t = 1; t < kLanes; ++t) {
    if (best[t] > top || (best[t] == top && at[t] < token)) {
      top = best[t];
      token = at[t];
    }
  }
  for (; i < n; ++i) {
    if (x[i] > top) {
      top = x[i];
      token = static_cast<int32_t>(i);
    }
  }
  return token;
}

std::vector<float> Probabilities(std::span<const float> logits, const SamplingParams& params) {
  const size_t V = logits.size();
  std::vector<float> probs(V, 0.0f);
  if (V == 0) return probs;
  if (params.greedy()) {
    probs[Argmax(logits)] = 1.0f;
    return probs;
  }
  // Candidate set: all tokens, or the top_k by logit (stable order: ties go to the lower id).
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  size_t keep = V;
  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < V) {
    keep = params.top_k;
    std::partial_sort(order.begin(), order.begin() + keep, order.end(), by_logit);
  } else if (params.top_p < 1.0f) {
    std::sort(order.begin(), order.end(), by_logit);
  }
  const double inv_t = 1.0 / params.temperature;
  double max_logit = -INFINITY;
  for (size_t i = 0; i < keep; ++i) max_logit = std::max<double>(max_logit, logits[order[i]]);
  std::vector<double> p(keep);
  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    p[i] = std::exp((logits[order[i]] - max_logit) * inv_t);
    total += p[i];
  }
  if (params.top_p < 1.0f) {
    // order[0..keep) is sorted by probability here: keep the smallest prefix reaching top_p.
    double cum = 0.0;
    size_t cut = keep;
    for (size_t i = 0; i < keep; ++i) {
      cum += p[i] / total;
      if (cum >= params.top_p) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
    total = std::accumulate(p.begin(), p.begin() + keep, 0.0);
  }
  for (size_t i = 0; i < keep; ++i) probs[order[i]] = static_cast<float>(p[i] / total);
  return probs;
}

int32_t SampleFrom(std::span<const float> probs, SequenceRng& rng) {
  double total = 0.0;
  for (float p : probs) total += p;
  const double u = rng.Uniform() * total;
  double cum = 0.0;
  int32_t last_nonzero = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0.0f) continue;
    cum += probs[i];
    last_nonzero = static_cast<int32_t>(i);
    if (u < cum) return last_nonzero;
  }
  return last_nonzero;  // rounding: u landed past the last cumulative sum
}

int32_t SampleToken(std::span<const float> logits, const SamplingParams& params, SequenceRng& rng) {
  if (params.greedy()) return Argmax(logits);
  auto probs = Probabilities(logits, params);
  return SampleFrom(probs, rng);
}

}  // namespace specula
