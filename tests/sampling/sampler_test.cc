#include "common/sampling/sampler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace specula {
namespace {

using ::testing::HasSubstr;

SamplingParams Params(float temperature, int32_t top_k = 0, float top_p = 1.0f, uint64_t seed = 0) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.seed = seed;
  return p;
}

// log of a distribution: softmax(Logs(p)) == p at temperature 1.
std::vector<float> Logs(const std::vector<double>& probs) {
  std::vector<float> out;
  for (double p : probs) out.push_back(static_cast<float>(std::log(p)));
  return out;
}

void ExpectProbs(const std::vector<float>& actual, const std::vector<double>& expected,
                 double tol = 1e-6) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    if (expected[i] == 0.0) {
      EXPECT_EQ(actual[i], 0.0f) << "token " << i << " must be excluded";
    } else {
      EXPECT_NEAR(actual[i], expected[i], tol) << "token " << i;
    }
  }
}

TEST(ArgmaxTest, TiesGoToLowestIndex) {
  EXPECT_EQ(Argmax(std::vector<float>{1.0f, 3.0f, 3.0f, 2.0f}), 1);
  EXPECT_EQ(Argmax(std::vector<float>{5.0f, 5.0f, 5.0f}), 0);
  EXPECT_EQ(Argmax(std::vector<float>{-4.0f, -2.0f, -3.0f, -2.0f}), 1);
  EXPECT_EQ(Argmax(std::vector<float>{0.0f, 0.0f, 0.5f}), 2);
  EXPECT_EQ(Argmax(std::vector<float>{-INFINITY, 7.0f}), 1);
}

// Rows as long as a vocabulary (the lane-parallel loop and its tail): the first index of the
// largest value, as std::max_element gives it, with ties across and within lanes, rows of
// -inf, a restricted head's row (-inf outside a few tokens) and NaNs first or later.
TEST(ArgmaxTest, LongRowsAgreeWithMaxElement) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> level(0, 6);
  auto reference = [](const std::vector<float>& row) {
    return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
  };
  for (size_t n : {31u, 32u, 33u, 47u, 100u, 1024u, 4099u}) {
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<float> row(n);
      for (float& v : row) v = static_cast<float>(level(rng));  // many ties
      if (trial % 5 == 1) std::fill(row.begin(), row.end(), -INFINITY);
      if (trial % 5 == 2) {
        std::fill(row.begin(), row.end(), -INFINITY);
        for (int j = 0; j < 3; ++j) row[rng() % n] = static_cast<float>(level(rng));
      }
      if (trial % 5 == 3) row[rng() % n] = NAN;
      if (trial % 5 == 4) row[0] = NAN;
      ASSERT_EQ(Argmax(row), reference(row)) << n << " logits, trial " << trial;
    }
  }
}

TEST(ProbabilitiesTest, GreedyIsOneHotAtArgmax) {
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 2.0f};
  ExpectProbs(Probabilities(logits, Params(0.0f)), {0.0, 1.0, 0.0, 0.0}, 0.0);
  // Greedy ignores top_k / top_p.
  ExpectProbs(Probabilities(logits, Params(0.0f, 3, 0.5f)), {0.0, 1.0, 0.0, 0.0}, 0.0);
}

TEST(ProbabilitiesTest, TemperatureScalesLogitsBeforeSoftmax) {
  // softmax([1, 2, 3] / 0.5) = softmax([2, 4, 6]).
  ExpectProbs(Probabilities(std::vector<float>{1.0f, 2.0f, 3.0f}, Params(0.5f)),
              {0.015876239976466765, 0.11731042782619838, 0.8668133321973349});
  // softmax([1, 2, 3] / 2) = softmax([0.5, 1, 1.5]).
  const double e0 = std::exp(0.5), e1 = std::exp(1.0), e2 = std::exp(1.5), s = e0 + e1 + e2;
  ExpectProbs(Probabilities(std::vector<float>{1.0f, 2.0f, 3.0f}, Params(2.0f)),
              {e0 / s, e1 / s, e2 / s});
  // Temperature 1 with large logits stays finite (max-subtracted).
  ExpectProbs(Probabilities(std::vector<float>{1000.0f, 1000.0f}, Params(1.0f)), {0.5, 0.5});
}

TEST(ProbabilitiesTest, TopKKeepsOnlyKTokensRenormalised) {
  // Top-2 of [1, 3, 2, 0] are ids 1 and 2: softmax([3, 2]).
  ExpectProbs(Probabilities(std::vector<float>{1.0f, 3.0f, 2.0f, 0.0f}, Params(1.0f, 2)),
              {0.0, 0.7310585786300049, 0.2689414213699951, 0.0});
  // Ties at the boundary go to the lower ids.
  ExpectProbs(Probabilities(std::vector<float>{2.0f, 1.0f, 2.0f, 2.0f}, Params(1.0f, 2)),
              {0.5, 0.0, 0.5, 0.0});
  // top_k >= vocab is the same as no top_k.
  const std::vector<float> logits = {0.3f, -0.2f, 1.1f};
  EXPECT_EQ(Probabilities(logits, Params(0.7f, 3)), Probabilities(logits, Params(0.7f, 0)));
  EXPECT_EQ(Probabilities(logits, Params(0.7f, 10)), Probabilities(logits, Params(0.7f, 0)));
  // top_k = 1 is greedy-like.
  ExpectProbs(Probabilities(logits, Params(5.0f, 1)), {0.0, 0.0, 1.0}, 0.0);
}

TEST(ProbabilitiesTest, TopPKeepsSmallestSetReachingP) {
  // Probabilities [0.15, 0.5, 0.05, 0.3] in shuffled order; sorted: 0.5, 0.3, 0.15, 0.05.
  const std::vector<float> logits = Logs({0.15, 0.5, 0.05, 0.3});
  ExpectProbs(Probabilities(logits, Params(1.0f, 0, 0.4f)), {0.0, 1.0, 0.0, 0.0});
  ExpectProbs(Probabilities(logits, Params(1.0f, 0, 0.75f)), {0.0, 0.625, 0.0, 0.375});
  ExpectProbs(Probabilities(logits, Params(1.0f, 0, 0.85f)),
              {0.15 / 0.95, 0.5 / 0.95, 0.0, 0.3 / 0.95});
  ExpectProbs(Probabilities(logits, Params(1.0f, 0, 0.99f)), {0.15, 0.5, 0.05, 0.3});
  ExpectProbs(Probabilities(logits, Params(1.0f, 0, 1.0f)), {0.15, 0.5, 0.05, 0.3});
}

TEST(ProbabilitiesTest, TopPAppliesToTheTopKRenormalisedDistribution) {
  // top_k=2 leaves [0.625, 0.375]; 0.625 alone reaches top_p = 0.6 (0.5 would not, unnormalised).
  const std::vector<float> logits = Logs({0.15, 0.5, 0.05, 0.3});
  ExpectProbs(Probabilities(logits, Params(1.0f, 2, 0.6f)), {0.0, 1.0, 0.0, 0.0});
  ExpectProbs(Probabilities(logits, Params(1.0f, 2, 0.7f)), {0.0, 0.625, 0.0, 0.375});
  // top_k=3 leaves [0.5, 0.3, 0.15] / 0.95; top_p=0.8 needs 0.5/0.95 + 0.3/0.95 = 0.842.
  ExpectProbs(Probabilities(logits, Params(1.0f, 3, 0.8f)), {0.0, 0.625, 0.0, 0.375});
}

TEST(SamplingParamsTest, ValidateNamesTheField) {
  EXPECT_TRUE(Params(0.0f).Validate().ok());
  EXPECT_TRUE(Params(0.7f, 50, 0.9f).Validate().ok());
  EXPECT_TRUE(Params(1.0f, 0, 1.0f).Validate().ok());

  for (float t : {-0.5f, NAN, INFINITY}) {
    Status s = Params(t).Validate();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << t;
    EXPECT_THAT(s.message(), HasSubstr("temperature")) << t;
  }
  Status k = Params(1.0f, -1).Validate();
  EXPECT_EQ(k.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(k.message(), "top_k must be >= 0, got -1");
  for (float p : {0.0f, -0.1f, 1.5f, NAN}) {
    Status s = Params(1.0f, 0, p).Validate();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << p;
    EXPECT_THAT(s.message(), HasSubstr("top_p must be in (0, 1]")) << p;
  }
}

std::vector<int32_t> Draw(const std::vector<float>& logits, const SamplingParams& params, int n) {
  SequenceRng rng(params.seed);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(SampleToken(logits, params, rng));
  return out;
}

TEST(SampleTokenTest, SameSeedSameSequenceDifferentSeedDiffers) {
  const std::vector<float> logits = {0.1f, 0.5f, -0.3f, 0.2f, 0.0f, 0.4f, -0.1f, 0.3f};
  const auto a = Draw(logits, Params(1.0f, 0, 1.0f, 42), 200);
  const auto b = Draw(logits, Params(1.0f, 0, 1.0f, 42), 200);
  const auto c = Draw(logits, Params(1.0f, 0, 1.0f, 43), 200);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  for (int32_t t : a) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, 8);
  }
}

TEST(SampleTokenTest, GreedyReturnsArgmax) {
  SequenceRng rng(7);
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 2.0f};
  for (int i = 0; i < 10; ++i) EXPECT_EQ(SampleToken(logits, Params(0.0f), rng), 1);
}

TEST(SampleTokenTest, EmpiricalFrequenciesMatchProbabilities) {
  const std::vector<float> logits = {0.5f, 1.5f, -0.5f, 1.0f, 0.0f};
  for (const SamplingParams& params :
       {Params(1.0f, 0, 1.0f, 1), Params(0.8f, 3, 1.0f, 2), Params(1.3f, 0, 0.8f, 3)}) {
    const std::vector<float> probs = Probabilities(logits, params);
    std::vector<int> counts(logits.size(), 0);
    const int n = 20000;
    for (int32_t t : Draw(logits, params, n)) counts[t]++;
    for (size_t i = 0; i < logits.size(); ++i) {
      EXPECT_NEAR(static_cast<double>(counts[i]) / n, probs[i], 0.01)
          << "token " << i << " T=" << params.temperature << " k=" << params.top_k
          << " p=" << params.top_p;
      if (probs[i] == 0.0f) {
        EXPECT_EQ(counts[i], 0) << "excluded token " << i << " was drawn";
      }
    }
  }
}

TEST(SampleFromTest, UnnormalisedProbabilitiesAndZeros) {
  SequenceRng rng(11);
  const std::vector<float> probs = {0.0f, 2.0f, 0.0f, 6.0f};
  std::vector<int> counts(4, 0);
  const int n = 20000;
  for (int i = 0; i < n; ++i) counts[SampleFrom(probs, rng)]++;
  EXPECT_EQ(counts[0], 0);
  EXPECT_EQ(counts[2], 0);
  EXPECT_NEAR(static_cast<double>(counts[1]) / n, 0.25, 0.01);
  EXPECT_NEAR(static_cast<double>(counts[3]) / n, 0.75, 0.01);
  // A single non-zero entry is always drawn.
  for (int i = 0; i < 100; ++i)
    EXPECT_EQ(SampleFrom(std::vector<float>{0.0f, 0.0f, 1e-30f}, rng), 2);
}

TEST(SequenceRngTest, UniformInUnitInterval) {
  SequenceRng a(5), b(5);
  for (int i = 0; i < 1000; ++i) {
    const double u = a.Uniform();
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
    EXPECT_EQ(u, b.Uniform());
  }
}

}  // namespace
}  // namespace specula
