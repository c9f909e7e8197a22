#include "common/spec/output_agreement.h"

#include <gtest/gtest.h>

#include <vector>

namespace specula {
namespace {

using Tokens = std::vector<int32_t>;

TEST(FirstDivergenceTest, IndexOfTheFirstDifferenceOrTheShorterLength) {
  EXPECT_EQ(FirstDivergence({1, 2, 3}, {1, 2, 3}), std::nullopt);
  EXPECT_EQ(FirstDivergence({}, {}), std::nullopt);
  EXPECT_EQ(FirstDivergence({1, 2, 3}, {1, 9, 3}), 1);
  EXPECT_EQ(FirstDivergence({5}, {6}), 0);
  EXPECT_EQ(FirstDivergence({1, 2}, {1, 2, 3}), 2);
  EXPECT_EQ(FirstDivergence({1, 2, 3}, {1, 2}), 2);
}

TEST(CorpusBleu4Test, IdenticalOutputsScoreOneHundred) {
  EXPECT_DOUBLE_EQ(CorpusBleu4({{1, 2, 3, 4, 5}, {7, 7, 8, 9}}, {{1, 2, 3, 4, 5}, {7, 7, 8, 9}}),
                   100.0);
}

TEST(CorpusBleu4Test, GeometricMeanOfClippedPrecisions) {
  // 1-grams 4/5, 2-grams 3/4, 3-grams 2/3, 4-grams 1/2; equal lengths: no brevity penalty.
  EXPECT_NEAR(CorpusBleu4({{1, 2, 3, 4, 6}}, {{1, 2, 3, 4, 5}}), 66.8740305, 1e-6);
}

TEST(CorpusBleu4Test, ShortCandidatesPayTheBrevityPenalty) {
  // Every n-gram matches, but 4 tokens against 8: exp(1 - 8 / 4).
  EXPECT_NEAR(CorpusBleu4({{1, 2, 3, 4}}, {{1, 2, 3, 4, 5, 6, 7, 8}}), 36.7879441, 1e-6);
  // Longer candidates are not penalised for length (only through precision).
  EXPECT_DOUBLE_EQ(CorpusBleu4({{1, 2, 3, 4, 1, 2, 3, 4}}, {{1, 2, 3, 4}}),
                   CorpusBleu4({{1, 2, 3, 4, 1, 2, 3, 4}}, {{1, 2, 3, 4}}));
  EXPECT_LT(CorpusBleu4({{1, 2, 3, 4, 1, 2, 3, 4}}, {{1, 2, 3, 4}}), 100.0);
}

TEST(CorpusBleu4Test, RepeatedTokensAreClippedAndAMissingOrderGivesZero) {
  // Unigram 7 appears 4 times but once in the reference (1/4); no bigram matches at all.
  EXPECT_DOUBLE_EQ(CorpusBleu4({{7, 7, 7, 7}}, {{7, 1, 2, 3}}), 0.0);
  // Shorter than 4 tokens: no 4-grams, so 0 (unsmoothed, as corpus BLEU is).
  EXPECT_DOUBLE_EQ(CorpusBleu4({{1, 2, 3}}, {{1, 2, 3}}), 0.0);
}

TEST(CorpusBleu4Test, CountsArePooledOverTheCorpusNotAveragedPerPair) {
  // Pooled: 9/10, 7/8, 5/6, 3/4 (not the mean of 100 and 66.87).
  EXPECT_NEAR(CorpusBleu4({{1, 2, 3, 4, 5}, {1, 2, 3, 4, 6}}, {{1, 2, 3, 4, 5}, {1, 2, 3, 4, 5}}),
              83.7592240, 1e-6);
}

TEST(CompareOutputsTest, IdenticalShareDivergenceAndBleu) {
  const std::vector<Tokens> lossless = {{1, 2, 3, 4, 5}, {1, 2, 3, 4, 5}, {4, 3, 2, 1, 0}};
  const std::vector<Tokens> outputs = {{1, 2, 3, 4, 5}, {1, 2, 3, 4, 6}, {4, 9, 2, 1, 0}};
  const OutputAgreement a = CompareOutputs(outputs, lossless);
  EXPECT_EQ(a.requests, 3);
  EXPECT_EQ(a.identical, 1);
  EXPECT_DOUBLE_EQ(a.identical_share(), 1.0 / 3.0);
  ASSERT_TRUE(a.mean_first_divergence.has_value());
  EXPECT_DOUBLE_EQ(*a.mean_first_divergence, (4.0 + 1.0) / 2.0);  // over the diverging ones
  EXPECT_DOUBLE_EQ(a.bleu4, CorpusBleu4(outputs, lossless));
  EXPECT_LT(a.bleu4, 100.0);
}

TEST(CompareOutputsTest, NoDivergenceWhenEverythingMatches) {
  const std::vector<Tokens> same = {{1, 2, 3, 4}, {5, 6, 7, 8}};
  const OutputAgreement a = CompareOutputs(same, same);
  EXPECT_EQ(a.identical, 2);
  EXPECT_DOUBLE_EQ(a.identical_share(), 1.0);
  EXPECT_FALSE(a.mean_first_divergence.has_value());
  EXPECT_DOUBLE_EQ(a.bleu4, 100.0);
}

}  // namespace
}  // namespace specula
