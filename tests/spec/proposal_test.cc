#include "common/spec/proposal.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace specula {
namespace {

using ::testing::ElementsAre;
using ::testing::FloatEq;
using ::testing::IsEmpty;
using ::testing::Pointwise;

TEST(TopKProposalTest, KeepsTheKMostProbableTokensRenormalisedInIdOrder) {
  const Proposal q = TopKProposal({0.1f, 0.4f, 0.05f, 0.3f, 0.15f}, 3);
  EXPECT_FALSE(q.dense());
  EXPECT_THAT(q.ids, ElementsAre(1, 3, 4));
  EXPECT_THAT(q.probs,
              Pointwise(FloatEq(), std::vector<float>{0.4f / 0.85f, 0.3f / 0.85f, 0.15f / 0.85f}));
  EXPECT_NEAR(std::accumulate(q.probs.begin(), q.probs.end(), 0.0), 1.0, 1e-6);
}

TEST(TopKProposalTest, TiesGoToTheLowerId) {
  const Proposal q = TopKProposal({0.2f, 0.2f, 0.2f, 0.2f, 0.2f}, 2);
  EXPECT_THAT(q.ids, ElementsAre(0, 1));
  const Proposal r = TopKProposal({0.1f, 0.3f, 0.3f, 0.3f}, 2);
  EXPECT_THAT(r.ids, ElementsAre(1, 2));
}

TEST(TopKProposalTest, ZeroKeepsTheDistributionDenseAndUnchanged) {
  const std::vector<float> p = {0.1f, 0.4f, 0.0f, 0.5f};
  const Proposal q = TopKProposal(p, 0);
  EXPECT_TRUE(q.dense());
  EXPECT_THAT(q.ids, IsEmpty());
  EXPECT_EQ(q.probs, p);
  // k covering a fully supported vocabulary: dense is as small.
  const Proposal all = TopKProposal({0.25f, 0.25f, 0.5f}, 3);
  EXPECT_TRUE(all.dense());
}

TEST(TopKProposalTest, TokensOfProbabilityZeroAreNeverKept) {
  // A shaped distribution (top-k / top-p sampling) with fewer positive tokens than k.
  const Proposal q = TopKProposal({0.0f, 0.6f, 0.0f, 0.4f, 0.0f}, 4);
  EXPECT_THAT(q.ids, ElementsAre(1, 3));
  EXPECT_THAT(q.probs, Pointwise(FloatEq(), std::vector<float>{0.6f, 0.4f}));
  // k at least the vocabulary but with zeros: sparse over the positive ones.
  EXPECT_THAT(TopKProposal({0.0f, 1.0f}, 8).ids, ElementsAre(1));
}

TEST(TopKProposalTest, SamplingDrawsOnlyKeptTokensWithTheirProbabilities) {
  const Proposal q = TopKProposal({0.1f, 0.4f, 0.05f, 0.3f, 0.15f}, 2);
  ASSERT_THAT(q.ids, ElementsAre(1, 3));
  SequenceRng rng(7);
  int64_t ones = 0;
  constexpr int kDraws = 20000;
  for (int i = 0; i < kDraws; ++i) {
    const int32_t t = SampleProposal(q, rng);
    ASSERT_TRUE(t == 1 || t == 3) << t;
    ones += t == 1 ? 1 : 0;
  }
  // P(1) = 4/7; 5 standard deviations of a binomial with 20000 draws is about 0.017.
  EXPECT_NEAR(static_cast<double>(ones) / kDraws, 4.0 / 7.0, 0.018);
  EXPECT_FLOAT_EQ(ProposalProbability(q, 3), 3.0f / 7.0f);
  EXPECT_EQ(ProposalProbability(q, 0), 0.0f);
  EXPECT_EQ(ProposalProbability(q, 4), 0.0f);
}

TEST(TopKProposalTest, AddSampledNodeAttachesExactlyTheDistributionItSampledFrom) {
  const std::vector<float> p = {0.1f, 0.4f, 0.05f, 0.3f, 0.15f};
  for (int32_t k : {0, 1, 2, 4}) {
    CandidateTree tree;
    SequenceRng rng(11);
    const int32_t node = AddSampledNode(tree, -1, p, k, rng);
    ASSERT_EQ(node, 0);
    const int32_t j = tree.proposal(node);
    ASSERT_EQ(j, 0);
    const Proposal expected = TopKProposal(p, k);
    EXPECT_EQ(
        std::vector<int32_t>(tree.distribution_ids(j).begin(), tree.distribution_ids(j).end()),
        expected.ids);
    EXPECT_EQ(std::vector<float>(tree.distribution(j).begin(), tree.distribution(j).end()),
              expected.probs);
    // The same draw as sampling the truncated proposal directly with the same stream.
    SequenceRng again(11);
    EXPECT_EQ(tree.token(node), SampleProposal(expected, again));
    EXPECT_EQ(tree.draft_prob(node), ProposalProbability(expected, tree.token(node)));
    EXPECT_TRUE(tree.Validate(5, 1, 1).ok()) << tree.Validate(5, 1, 1);
  }
}

}  // namespace
}  // namespace specula
