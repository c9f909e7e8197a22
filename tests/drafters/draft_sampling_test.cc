// The probabilities model-based drafters rank and report with (common/drafters/draft_sampling.h),
// against a double-precision softmax written here.
#include "common/drafters/draft_sampling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace specula {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<double> ReferenceSoftmax(const std::vector<float>& row) {
  double max_logit = -kInf;
  for (float l : row) max_logit = std::max<double>(max_logit, l);
  std::vector<double> p;
  double total = 0.0;
  for (float l : row) total += std::exp(l - max_logit);
  for (float l : row) p.push_back(std::exp(l - max_logit) / total);
  return p;
}

TEST(DraftSamplingTest, SoftmaxMatchesTheReferenceAndSkipsTokensOutsideTheDraftVocabulary) {
  // -inf marks tokens a restricted head cannot rank: probability exactly 0.
  const std::vector<float> row = {1.5f, -kInf, 0.25f, 3.0f, -kInf, -2.0f, 3.0f};
  const std::vector<float> p = Softmax(row);
  const std::vector<double> ref = ReferenceSoftmax(row);
  ASSERT_EQ(p.size(), row.size());
  double total = 0.0;
  for (size_t i = 0; i < row.size(); ++i) {
    EXPECT_NEAR(p[i], ref[i], 1e-6) << i;
    total += p[i];
  }
  EXPECT_EQ(p[1], 0.0f);
  EXPECT_EQ(p[4], 0.0f);
  EXPECT_NEAR(total, 1.0, 1e-6);
  EXPECT_TRUE(Softmax({}).empty());
}

TEST(DraftSamplingTest, ArgmaxWithProbabilityIsTheSoftmaxOfTheArgmax) {
  const std::vector<float> row = {0.5f, -kInf, 2.0f, 1.0f, 2.0f, -kInf, -1.0f};
  const TopToken top = ArgmaxWithProbability(row);
  EXPECT_EQ(top.token, 2);  // a tie goes to the lower id, as Argmax
  EXPECT_NEAR(top.prob, ReferenceSoftmax(row)[2], 1e-6);
  // One finite logit: certain.
  const TopToken only = ArgmaxWithProbability(std::vector<float>{-kInf, 4.0f, -kInf});
  EXPECT_EQ(only.token, 1);
  EXPECT_FLOAT_EQ(only.prob, 1.0f);
  // Large logits do not overflow (exponentials are taken after subtracting the max).
  const TopToken big = ArgmaxWithProbability(std::vector<float>{1000.0f, 999.0f});
  EXPECT_EQ(big.token, 0);
  EXPECT_NEAR(big.prob, 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
}

}  // namespace
}  // namespace specula
