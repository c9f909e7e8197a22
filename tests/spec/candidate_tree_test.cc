#include "common/spec/candidate_tree.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace specula {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

void ExpectInvalid(const Status& status, const std::string& fragment) {
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr(fragment));
}

TEST(CandidateTreeTest, ChainLinksEachTokenToThePreviousOne) {
  const std::vector<int32_t> tokens = {5, 7, 9};
  const CandidateTree tree = CandidateTree::Chain(tokens);
  ASSERT_EQ(tree.size(), 3);
  EXPECT_FALSE(tree.empty());
  EXPECT_THAT(tree.tokens(), ElementsAre(5, 7, 9));
  EXPECT_THAT(tree.parents(), ElementsAre(-1, 0, 1));
  for (int32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(tree.depth(i), i + 1);
    EXPECT_EQ(tree.proposal(i), -1) << "chain candidates are deterministic";
    EXPECT_EQ(tree.draft_prob(i), 1.0f);
  }
  EXPECT_EQ(tree.max_depth(), 3);
  EXPECT_EQ(tree.num_distributions(), 0);
  EXPECT_THAT(tree.Children(-1), ElementsAre(0));
  EXPECT_THAT(tree.Children(1), ElementsAre(2));
  EXPECT_THAT(tree.Children(2), IsEmpty());
  EXPECT_THAT(tree.PathTo(2), ElementsAre(0, 1, 2));
  EXPECT_TRUE(tree.Validate(10, 3, 3).ok());
}

TEST(CandidateTreeTest, EmptyTree) {
  const CandidateTree chain = CandidateTree::Chain({});
  EXPECT_TRUE(chain.empty());
  EXPECT_EQ(chain.size(), 0);
  EXPECT_EQ(chain.max_depth(), 0);
  EXPECT_THAT(chain.Children(-1), IsEmpty());
  EXPECT_TRUE(chain.Validate(10, 0, 0).ok());
}

TEST(CandidateTreeTest, AddNodeTracksDepthsChildrenAndPaths) {
  // -1 ─┬─ 0 (tok 3) ─┬─ 2 (tok 8) ── 4 (tok 1)
  //     │             └─ 3 (tok 9)
  //     └─ 1 (tok 4) ──── 5 (tok 3)
  CandidateTree tree;
  EXPECT_EQ(tree.AddNode(-1, 3, 0.5f), 0);
  EXPECT_EQ(tree.AddNode(-1, 4, 0.25f), 1);
  EXPECT_EQ(tree.AddNode(0, 8), 2);
  EXPECT_EQ(tree.AddNode(0, 9), 3);
  EXPECT_EQ(tree.AddNode(2, 1), 4);
  EXPECT_EQ(tree.AddNode(1, 3), 5);
  EXPECT_THAT(tree.tokens(), ElementsAre(3, 4, 8, 9, 1, 3));
  EXPECT_THAT(tree.parents(), ElementsAre(-1, -1, 0, 0, 2, 1));
  EXPECT_EQ(tree.depth(0), 1);
  EXPECT_EQ(tree.depth(1), 1);
  EXPECT_EQ(tree.depth(2), 2);
  EXPECT_EQ(tree.depth(3), 2);
  EXPECT_EQ(tree.depth(4), 3);
  EXPECT_EQ(tree.depth(5), 2);
  EXPECT_EQ(tree.max_depth(), 3);
  EXPECT_EQ(tree.draft_prob(0), 0.5f);
  EXPECT_EQ(tree.draft_prob(1), 0.25f);
  EXPECT_EQ(tree.draft_prob(2), 1.0f);

  EXPECT_THAT(tree.Children(-1), ElementsAre(0, 1));
  EXPECT_THAT(tree.Children(0), ElementsAre(2, 3));
  EXPECT_THAT(tree.Children(1), ElementsAre(5));
  EXPECT_THAT(tree.Children(4), IsEmpty());
  EXPECT_THAT(tree.PathTo(0), ElementsAre(0));
  EXPECT_THAT(tree.PathTo(4), ElementsAre(0, 2, 4));
  EXPECT_THAT(tree.PathTo(5), ElementsAre(1, 5));
  EXPECT_THAT(tree.PathTo(-1), IsEmpty());
  EXPECT_THAT(tree.PathTo(6), IsEmpty());
  EXPECT_TRUE(tree.Validate(10, 6, 3).ok());
}

TEST(CandidateTreeTest, DistributionsAreIndexedInOrder) {
  CandidateTree tree;
  EXPECT_EQ(tree.AddDistribution({0.5f, 0.5f, 0.0f}), 0);
  EXPECT_EQ(tree.AddDistribution({0.1f, 0.2f, 0.7f}), 1);
  EXPECT_EQ(tree.num_distributions(), 2);
  EXPECT_THAT(std::vector<float>(tree.distribution(1).begin(), tree.distribution(1).end()),
              ElementsAre(0.1f, 0.2f, 0.7f));
  tree.AddNode(-1, 1, 0.5f, 0);
  tree.AddNode(0, 2, 0.7f, 1);
  tree.AddNode(0, 0, 0.1f, 1);
  EXPECT_EQ(tree.proposal(0), 0);
  EXPECT_EQ(tree.proposal(2), 1);
  EXPECT_TRUE(tree.Validate(3, 3, 2).ok());
}

TEST(CandidateTreeTest, TruncateKeepsAPrefixAndTheDistributionsItUses) {
  CandidateTree tree;
  tree.AddNode(-1, 1, 0.5f, tree.AddDistribution({0.5f, 0.5f, 0.0f}));
  tree.AddNode(0, 2, 0.7f, tree.AddSparseDistribution({0, 2}, {0.3f, 0.7f}));
  tree.AddNode(1, 0, 0.9f, tree.AddDistribution({0.9f, 0.1f, 0.0f}));
  tree.Truncate(5);  // longer than the tree: unchanged
  EXPECT_EQ(tree.size(), 3);
  tree.Truncate(2);
  EXPECT_THAT(tree.tokens(), ElementsAre(1, 2));
  EXPECT_EQ(tree.num_distributions(), 2);
  EXPECT_FALSE(tree.distribution_is_dense(1));
  EXPECT_FLOAT_EQ(tree.draft_prob(1), 0.7f);
  EXPECT_TRUE(tree.Validate(3, 2, 2).ok());
  tree.Truncate(0);
  EXPECT_TRUE(tree.empty());
  EXPECT_EQ(tree.num_distributions(), 0);
  CandidateTree chain = CandidateTree::Chain(std::vector<int32_t>{4, 5, 6});
  chain.Truncate(1);
  EXPECT_THAT(chain.tokens(), ElementsAre(4));
  EXPECT_EQ(chain.max_depth(), 1);
}

TEST(CandidateTreeTest, BadParentNeverCrashesAndValidateRejectsIt) {
  CandidateTree tree;
  tree.AddNode(-1, 1);
  tree.AddNode(5, 2);   // past the end
  tree.AddNode(2, 3);   // itself
  tree.AddNode(-7, 4);  // below -1
  tree.AddNode(3, 5);   // a node whose own parent is bad
  EXPECT_EQ(tree.depth(1), 0);
  EXPECT_EQ(tree.depth(2), 0);
  EXPECT_EQ(tree.depth(3), 0);
  EXPECT_EQ(tree.depth(4), 1);
  // PathTo and Children stay well defined.
  EXPECT_THAT(tree.PathTo(2), ElementsAre(2));
  EXPECT_THAT(tree.PathTo(4), ElementsAre(3, 4));
  EXPECT_THAT(tree.Children(5), ElementsAre(1));
  ExpectInvalid(tree.Validate(10, 10, 10), "candidate tree node 1: parent 5 does not precede it");

  CandidateTree self;
  self.AddNode(0, 1);
  ExpectInvalid(self.Validate(10, 10, 10), "node 0: parent 0 does not precede it");
  CandidateTree negative;
  negative.AddNode(-1, 1);
  negative.AddNode(-2, 1);
  ExpectInvalid(negative.Validate(10, 10, 10), "node 1: parent -2 does not precede it");
}

TEST(CandidateTreeTest, ValidateRejectsTokensOutsideTheVocabulary) {
  CandidateTree tree;
  tree.AddNode(-1, 0);
  tree.AddNode(0, 4095);
  tree.AddNode(1, 9000);
  ExpectInvalid(tree.Validate(4096, 8, 8),
                "candidate tree node 2: token 9000 is outside the vocabulary [0, 4096)");
  CandidateTree negative;
  negative.AddNode(-1, -1);
  ExpectInvalid(negative.Validate(4096, 8, 8), "node 0: token -1 is outside the vocabulary");
}

TEST(CandidateTreeTest, ValidateEnforcesTheNodeBudget) {
  const std::vector<int32_t> tokens(9, 1);
  CandidateTree tree;
  for (int32_t t : tokens) tree.AddNode(-1, t);
  ExpectInvalid(tree.Validate(10, 8, 8), "tree has 9 nodes, over the budget of 8");
  EXPECT_TRUE(tree.Validate(10, 9, 1).ok());
}

TEST(CandidateTreeTest, ValidateEnforcesTheMaximumDepth) {
  const std::vector<int32_t> tokens(7, 2);
  const CandidateTree tree = CandidateTree::Chain(tokens);
  ExpectInvalid(tree.Validate(10, 10, 6), "node 6: depth 7 exceeds the maximum depth 6");
  EXPECT_TRUE(tree.Validate(10, 10, 7).ok());
  CandidateTree flat;
  flat.AddNode(-1, 1);
  ExpectInvalid(flat.Validate(10, 10, 0), "node 0: depth 1 exceeds the maximum depth 0");
}

TEST(CandidateTreeTest, ValidateRejectsDraftProbabilitiesOutsideUnitInterval) {
  for (float bad : {1.5f, -0.1f, std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity()}) {
    CandidateTree tree;
    tree.AddNode(-1, 1, 0.0f);
    tree.AddNode(0, 1, bad);
    ExpectInvalid(tree.Validate(10, 10, 10), "candidate tree node 1: draft_prob");
    ExpectInvalid(tree.Validate(10, 10, 10), "outside [0, 1]");
  }
  CandidateTree edge;
  edge.AddNode(-1, 1, 0.0f);
  edge.AddNode(-1, 2, 1.0f);
  EXPECT_TRUE(edge.Validate(10, 10, 10).ok());
}

TEST(CandidateTreeTest, ValidateRejectsUnknownProposals) {
  CandidateTree tree;
  tree.AddDistribution({0.25f, 0.25f, 0.25f, 0.25f});
  tree.AddNode(-1, 1, 0.25f, 0);
  tree.AddNode(0, 2, 0.25f, 1);
  ExpectInvalid(tree.Validate(4, 10, 10), "candidate tree node 1: proposal 1");
  CandidateTree negative;
  negative.AddNode(-1, 1, 1.0f, -2);
  ExpectInvalid(negative.Validate(4, 10, 10), "node 0: proposal -2");
}

TEST(CandidateTreeTest, ValidateRejectsDistributionsOfTheWrongSize) {
  CandidateTree tree;
  tree.AddDistribution({0.5f, 0.5f, 0.0f, 0.0f});
  tree.AddDistribution({0.5f, 0.5f, 0.0f});
  tree.AddNode(-1, 1, 0.5f, 0);
  ExpectInvalid(tree.Validate(4, 10, 10), "candidate tree distribution 1: size 3");
  ExpectInvalid(tree.Validate(4, 10, 10), "vocabulary size 4");
}

TEST(CandidateTreeTest, ValidateRejectsNegativeOrNonFiniteDistributionEntries) {
  for (float bad :
       {-0.5f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    CandidateTree tree;
    tree.AddDistribution({0.5f, bad, 0.5f});
    tree.AddNode(-1, 0, 0.5f, 0);
    ExpectInvalid(tree.Validate(3, 10, 10), "candidate tree distribution 0: entry 1 is");
    ExpectInvalid(tree.Validate(3, 10, 10), "not a finite probability >= 0");
  }
}

TEST(CandidateTreeTest, ValidateRejectsASampledTokenItsDistributionCannotProduce) {
  CandidateTree tree;
  tree.AddDistribution({0.5f, 0.5f, 0.0f});
  tree.AddNode(-1, 0, 0.5f, 0);
  tree.AddNode(0, 2, 0.0f, 0);
  ExpectInvalid(tree.Validate(3, 10, 10),
                "candidate tree node 1: token 2 was sampled from distribution 0, which gives it "
                "probability 0");
  // The same token as a deterministic candidate is fine.
  CandidateTree deterministic;
  deterministic.AddDistribution({0.5f, 0.5f, 0.0f});
  deterministic.AddNode(-1, 0, 0.5f, 0);
  deterministic.AddNode(0, 2, 0.0f, -1);
  EXPECT_TRUE(deterministic.Validate(3, 10, 10).ok());
}

TEST(CandidateTreeTest, SparseDistributionsKeepTheirIdsAndLookUpProbabilities) {
  CandidateTree tree;
  EXPECT_EQ(tree.AddDistribution({0.5f, 0.5f, 0.0f, 0.0f, 0.0f}), 0);
  EXPECT_EQ(tree.AddSparseDistribution({1, 3}, {0.25f, 0.75f}), 1);
  EXPECT_EQ(tree.num_distributions(), 2);
  EXPECT_TRUE(tree.distribution_is_dense(0));
  EXPECT_THAT(tree.distribution_ids(0), IsEmpty());
  EXPECT_EQ(tree.distribution(0).size(), 5u);
  EXPECT_FALSE(tree.distribution_is_dense(1));
  EXPECT_THAT(
      std::vector<int32_t>(tree.distribution_ids(1).begin(), tree.distribution_ids(1).end()),
      ElementsAre(1, 3));
  EXPECT_THAT(std::vector<float>(tree.distribution(1).begin(), tree.distribution(1).end()),
              ElementsAre(0.25f, 0.75f));
  EXPECT_EQ(tree.ProposalProbability(0, 1), 0.5f);
  EXPECT_EQ(tree.ProposalProbability(0, 7), 0.0f);  // out of range
  EXPECT_EQ(tree.ProposalProbability(1, 3), 0.75f);
  EXPECT_EQ(tree.ProposalProbability(1, 2), 0.0f);  // off the support
  EXPECT_EQ(tree.ProposalProbability(1, 4), 0.0f);
  tree.AddNode(-1, 3, 0.75f, 1);
  tree.AddNode(0, 0, 0.5f, 0);
  tree.AddNode(0, 1, 0.25f, 1);
  EXPECT_TRUE(tree.Validate(5, 10, 10).ok());
}

TEST(CandidateTreeTest, ValidateRejectsMalformedSparseDistributionsNamingTheField) {
  struct Case {
    std::vector<int32_t> ids;
    std::vector<float> probs;
    const char* fragment;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (const Case& c : std::vector<Case>{
           {{1, 2}, {0.5f}, "distribution 1: 2 ids but 1 probs"},
           {{1, 2}, {0.5f, 0.2f, 0.3f}, "distribution 1: 2 ids but 3 probs"},
           {{-1, 2}, {0.5f, 0.5f}, "distribution 1: ids[0] = -1 is outside the vocabulary [0, 5)"},
           {{1, 5}, {0.5f, 0.5f}, "distribution 1: ids[1] = 5 is outside the vocabulary [0, 5)"},
           {{2, 2}, {0.5f, 0.5f}, "distribution 1: ids[1] = 2 does not follow ids[0] = 2"},
           {{3, 1}, {0.5f, 0.5f}, "distribution 1: ids[1] = 1 does not follow ids[0] = 3"},
           {{1, 2}, {0.5f, -0.1f}, "distribution 1: probs[1] is -0.1, not a probability in [0, 1]"},
           {{1, 2}, {1.5f, 0.5f}, "distribution 1: probs[0] is 1.5"},
           {{1, 2}, {nan, 0.5f}, "distribution 1: probs[0] is nan"},
           {{1, 2}, {0.5f, inf}, "distribution 1: probs[1] is inf"},
           {{1, 2}, {0.0f, 0.0f}, "distribution 1: probabilities sum to 0"},
       }) {
    CandidateTree tree;
    tree.AddDistribution({0.2f, 0.2f, 0.2f, 0.2f, 0.2f});
    tree.AddSparseDistribution(c.ids, c.probs);
    tree.AddNode(-1, 0, 0.2f, 0);
    ExpectInvalid(tree.Validate(5, 10, 10), StrCat("candidate tree ", c.fragment));
  }
  // A dense distribution of zeros is no distribution either.
  CandidateTree zeros;
  zeros.AddDistribution({0.0f, 0.0f, 0.0f});
  ExpectInvalid(zeros.Validate(3, 10, 10), "candidate tree distribution 0: probabilities sum to 0");
}

TEST(CandidateTreeTest, ValidateRejectsASampledTokenOffItsSparseDistribution) {
  CandidateTree tree;
  tree.AddSparseDistribution({0, 2}, {0.5f, 0.5f});
  tree.AddNode(-1, 2, 0.5f, 0);
  tree.AddNode(0, 1, 0.0f, 0);
  ExpectInvalid(tree.Validate(3, 10, 10),
                "candidate tree node 1: token 1 was sampled from distribution 0, which gives it "
                "probability 0");
  CandidateTree zero_entry;
  zero_entry.AddSparseDistribution({0, 2}, {1.0f, 0.0f});
  zero_entry.AddNode(-1, 2, 0.0f, 0);
  ExpectInvalid(zero_entry.Validate(3, 10, 10), "node 0: token 2 was sampled from distribution 0");
}

TEST(CandidateTreeTest, FailedTreeIsEmptyAndValidateReturnsWhy) {
  const CandidateTree tree = CandidateTree::Failed(UnavailableError("drafter lost sequence 3"));
  EXPECT_TRUE(tree.empty());
  const Status st = tree.Validate(100, 4, 4);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_EQ(st.message(), "drafter lost sequence 3");
  EXPECT_TRUE(CandidateTree().Validate(100, 4, 4).ok());
}

}  // namespace
}  // namespace specula
