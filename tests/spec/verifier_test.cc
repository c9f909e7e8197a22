#include "common/spec/verifier.h"

#include <ATen/ATen.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "common/spec/proposal.h"
#include "common/spec/tensor_verifier.h"
#include "tests/spec/chi_square.h"
#include "tests/testing/test_device.h"

namespace specula {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

SamplingParams Sampling(float temperature, int32_t top_k = 0, float top_p = 1.0f) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  return p;
}

VerifyParams Mode(VerifyMode mode) {
  VerifyParams p;
  p.mode = mode;
  return p;
}

// Row-major logits for a tree: rows[0] at the pending token, rows[i + 1] at node i.
struct Rows {
  std::vector<float> data;
  int64_t rows = 0;
  int64_t vocab = 0;

  explicit Rows(const std::vector<std::vector<float>>& rows_in)
      : rows(static_cast<int64_t>(rows_in.size())),
        vocab(rows_in.empty() ? 0 : static_cast<int64_t>(rows_in[0].size())) {
    for (const auto& r : rows_in) data.insert(data.end(), r.begin(), r.end());
  }
  TreeLogits view() const { return {.data = data.data(), .rows = rows, .vocab = vocab}; }
};

// A logits row of `vocab` entries, 0 everywhere except the given (token, logit) pairs.
std::vector<float> Row(int32_t vocab, std::initializer_list<std::pair<int32_t, float>> entries) {
  std::vector<float> row(vocab, 0.0f);
  for (const auto& [token, logit] : entries) row[token] = logit;
  return row;
}

// Logits whose softmax at temperature 1 is `probs`.
std::vector<float> LogitsOf(const std::vector<double>& probs) {
  std::vector<float> out;
  for (double p : probs) out.push_back(static_cast<float>(std::log(p)));
  return out;
}

VerifyResult MustVerify(const CandidateTree& tree, const Rows& rows, const SamplingParams& sampling,
                        const VerifyParams& params, SequenceRng& rng) {
  auto result = VerifyTree(tree, rows.view(), sampling, params, rng);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? *result : VerifyResult{};
}

VerifyResult MustVerify(const CandidateTree& tree, const Rows& rows, const SamplingParams& sampling,
                        const VerifyParams& params = {}) {
  SequenceRng rng(1);
  return MustVerify(tree, rows, sampling, params, rng);
}

// ---------------------------------------------------------------------------------------------
// Parameters and names.

TEST(VerifyParamsTest, DefaultsAreValid) { EXPECT_TRUE(VerifyParams().Validate().ok()); }

TEST(VerifyParamsTest, ValidateNamesTheField) {
  auto expect_invalid = [](VerifyParams p, const std::string& field) {
    const Status s = p.Validate();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << field;
    EXPECT_THAT(s.message(), HasSubstr(field));
  };
  VerifyParams p;
  p.specdec_beta = 0;
  expect_invalid(p, "specdec_beta");
  p = {};
  p.specdec_tau = -0.5f;
  expect_invalid(p, "specdec_tau");
  p.specdec_tau = std::numeric_limits<float>::infinity();
  expect_invalid(p, "specdec_tau");
  p.specdec_tau = std::numeric_limits<float>::quiet_NaN();
  expect_invalid(p, "specdec_tau");
  p = {};
  p.typical_epsilon = 0.0f;
  expect_invalid(p, "typical_epsilon");
  p.typical_epsilon = 1.5f;
  expect_invalid(p, "typical_epsilon");
  p = {};
  p.typical_delta = 0.0f;
  expect_invalid(p, "typical_delta");
  p.typical_delta = std::numeric_limits<float>::quiet_NaN();
  expect_invalid(p, "typical_delta");
  p = {};
  p.specdec_beta = 1;
  p.specdec_tau = 0.0f;
  p.typical_epsilon = 1.0f;
  EXPECT_TRUE(p.Validate().ok());
}

TEST(VerifyModeTest, NamesRoundTrip) {
  for (VerifyMode mode : {VerifyMode::kLossless, VerifyMode::kSpecDec, VerifyMode::kTypical}) {
    auto parsed = ParseVerifyMode(VerifyModeName(mode));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, mode);
  }
  EXPECT_STREQ(VerifyModeName(VerifyMode::kLossless), "lossless");
  EXPECT_STREQ(VerifyModeName(VerifyMode::kSpecDec), "specdec");
  EXPECT_STREQ(VerifyModeName(VerifyMode::kTypical), "typical");
  EXPECT_EQ(*ParseVerifyMode("greedy"), VerifyMode::kLossless);
  EXPECT_EQ(*ParseVerifyMode("sample"), VerifyMode::kLossless);
  EXPECT_FALSE(VerifyParams().lossy());
  EXPECT_TRUE(Mode(VerifyMode::kSpecDec).lossy());
  EXPECT_TRUE(Mode(VerifyMode::kTypical).lossy());
}

TEST(VerifyModeTest, UnknownNameListsTheValidOnes) {
  auto parsed = ParseVerifyMode("medusa");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(parsed.status().message(), HasSubstr("'medusa'"));
  EXPECT_THAT(parsed.status().message(), HasSubstr("lossless, greedy, sample, specdec, typical"));
}

// ---------------------------------------------------------------------------------------------
// Greedy (lossless).

// Vocabulary 6; argmax is 2 at the pending token, then 4, then 1, then 5 along the chain 2-4-1.
Rows GreedyChainRows() {
  return Rows({Row(6, {{2, 3.0f}, {4, 1.0f}}), Row(6, {{4, 2.0f}, {3, 1.9f}}), Row(6, {{1, 1.0f}}),
               Row(6, {{5, 0.5f}, {0, 0.4f}})});
}

TEST(VerifyGreedyTest, ChainMatchingTheArgmaxIsAcceptedWithTheBonusAfterIt) {
  const std::vector<int32_t> tokens = {2, 4, 1};
  const VerifyResult r =
      MustVerify(CandidateTree::Chain(tokens), GreedyChainRows(), Sampling(0.0f));
  EXPECT_THAT(r.accepted_nodes, ElementsAre(0, 1, 2));
  EXPECT_EQ(r.bonus_token, 5);
}

TEST(VerifyGreedyTest, FirstMismatchStopsAndTheTargetTokenReplacesIt) {
  const std::vector<int32_t> tokens = {2, 3, 1};
  const VerifyResult r =
      MustVerify(CandidateTree::Chain(tokens), GreedyChainRows(), Sampling(0.0f));
  EXPECT_THAT(r.accepted_nodes, ElementsAre(0));
  EXPECT_EQ(r.bonus_token, 4);

  const std::vector<int32_t> wrong_first = {4, 4, 1};
  const VerifyResult none =
      MustVerify(CandidateTree::Chain(wrong_first), GreedyChainRows(), Sampling(0.0f));
  EXPECT_THAT(none.accepted_nodes, IsEmpty());
  EXPECT_EQ(none.bonus_token, 2);
}

TEST(VerifyGreedyTest, EmptyTreeGivesTheArgmaxOfTheFirstRow) {
  const VerifyResult r =
      MustVerify(CandidateTree(), Rows({Row(5, {{3, 1.0f}, {1, 0.5f}})}), Sampling(0.0f));
  EXPECT_THAT(r.accepted_nodes, IsEmpty());
  EXPECT_EQ(r.bonus_token, 3);
}

TEST(VerifyGreedyTest, TreeFollowsTheBranchMatchingTheArgmax) {
  // -1 ─┬─ 0 (tok 1) ── 3 (tok 2)
  //     ├─ 1 (tok 2) ─┬─ 4 (tok 0)
  //     │             ├─ 5 (tok 3) ── 7 (tok 3)
  //     │             └─ 6 (tok 3)        (duplicate: the first in insertion order wins)
  //     └─ 2 (tok 4)
  CandidateTree tree;
  tree.AddNode(-1, 1);
  tree.AddNode(-1, 2);
  tree.AddNode(-1, 4);
  tree.AddNode(0, 2);
  tree.AddNode(1, 0);
  tree.AddNode(1, 3);
  tree.AddNode(1, 3);
  tree.AddNode(5, 3);
  std::vector<std::vector<float>> rows(tree.size() + 1, Row(5, {{0, 1.0f}}));
  rows[0] = Row(5, {{2, 2.0f}, {1, 1.5f}});  // argmax 2 -> node 1
  rows[2] = Row(5, {{3, 2.0f}});             // node 1: argmax 3 -> node 5
  rows[6] = Row(5, {{3, 2.0f}});             // node 5: argmax 3 -> node 7
  rows[8] = Row(5, {{4, 2.0f}});             // node 7 (leaf): bonus 4
  const VerifyResult r = MustVerify(tree, Rows(rows), Sampling(0.0f));
  EXPECT_THAT(r.accepted_nodes, ElementsAre(1, 5, 7));
  EXPECT_EQ(r.bonus_token, 4);

  rows[6] = Row(5, {{1, 2.0f}});  // node 5 now predicts 1, which it has no child for
  const VerifyResult partial = MustVerify(tree, Rows(rows), Sampling(0.0f));
  EXPECT_THAT(partial.accepted_nodes, ElementsAre(1, 5));
  EXPECT_EQ(partial.bonus_token, 1);
}

TEST(VerifyGreedyTest, ConsumesNoRandomNumbers) {
  CandidateTree tree;
  const int32_t j = tree.AddDistribution({0.1f, 0.2f, 0.3f, 0.2f, 0.1f, 0.1f});
  tree.AddNode(-1, 2, 0.3f, j);
  tree.AddNode(-1, 4, 0.1f, j);
  tree.AddNode(0, 3);
  tree.AddNode(1, 1);
  // Every row but the first predicts 5 by a margin SpecDec's tau cannot bridge.
  std::vector<std::vector<float>> rows(tree.size() + 1, Row(6, {{5, 3.0f}}));
  rows[0] = Row(6, {{2, 1.0f}});
  const Rows logits(rows);
  for (VerifyMode mode : {VerifyMode::kLossless, VerifyMode::kSpecDec, VerifyMode::kTypical}) {
    SequenceRng rng(42), reference(42);
    const VerifyResult r = MustVerify(tree, logits, Sampling(0.0f), Mode(mode), rng);
    EXPECT_THAT(r.accepted_nodes, ElementsAre(0)) << VerifyModeName(mode);
    EXPECT_EQ(r.bonus_token, 5) << VerifyModeName(mode);
    EXPECT_EQ(rng.Uniform(), reference.Uniform()) << VerifyModeName(mode) << " drew numbers";
  }
}

// ---------------------------------------------------------------------------------------------
// Input validation.

TEST(VerifyTreeTest, BadInputsAreInvalidArgumentWithClearMessages) {
  const std::vector<int32_t> tokens = {2, 4, 1};
  const CandidateTree chain = CandidateTree::Chain(tokens);
  auto expect_invalid = [](const StatusOr<VerifyResult>& r, const std::string& fragment) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr(fragment));
  };
  SequenceRng rng(0);
  const Rows good = GreedyChainRows();

  // One row short.
  const Rows short_rows({Row(6, {}), Row(6, {}), Row(6, {})});
  expect_invalid(VerifyTree(chain, short_rows.view(), Sampling(0.0f), {}, rng),
                 "logits have 3 rows, expected one per tree node plus one (4)");
  // A token outside the logits' vocabulary.
  const std::vector<int32_t> oov_tokens = {2, 6, 1};
  expect_invalid(VerifyTree(CandidateTree::Chain(oov_tokens), good.view(), Sampling(0.0f), {}, rng),
                 "candidate tree node 1: token 6 is outside the vocabulary [0, 6)");
  // A parent after its child.
  CandidateTree backwards;
  backwards.AddNode(1, 2);
  backwards.AddNode(-1, 4);
  backwards.AddNode(0, 1);
  expect_invalid(VerifyTree(backwards, good.view(), Sampling(0.0f), {}, rng),
                 "candidate tree node 0: parent 1 does not precede it");
  // A distribution of the wrong size.
  CandidateTree wrong_size;
  wrong_size.AddDistribution({0.5f, 0.5f});
  wrong_size.AddNode(-1, 1, 0.5f, 0);
  const Rows two_rows({Row(6, {}), Row(6, {})});
  expect_invalid(VerifyTree(wrong_size, two_rows.view(), Sampling(1.0f), {}, rng),
                 "distribution 0: size 2 differs from the vocabulary size 6");
  // Bad verify and sampling parameters.
  VerifyParams bad_params;
  bad_params.specdec_beta = 0;
  expect_invalid(VerifyTree(chain, good.view(), Sampling(0.0f), bad_params, rng), "specdec_beta");
  expect_invalid(VerifyTree(chain, good.view(), Sampling(1.0f, 0, 0.0f), {}, rng), "top_p");
  expect_invalid(VerifyTree(chain, good.view(), Sampling(-1.0f), {}, rng), "temperature");
  // No vocabulary / no data.
  expect_invalid(VerifyTree(CandidateTree(), TreeLogits{.data = nullptr, .rows = 1, .vocab = 0},
                            Sampling(0.0f), {}, rng),
                 "vocabulary size");
  expect_invalid(VerifyTree(CandidateTree(), TreeLogits{.data = nullptr, .rows = 1, .vocab = 6},
                            Sampling(0.0f), {}, rng),
                 "null");
}

// ---------------------------------------------------------------------------------------------
// Sampled (lossless): exact properties; the distribution tests are further down.

TEST(VerifySampledTest, EmptyTreeDrawsExactlyLikePlainSampling) {
  const std::vector<float> row = {0.3f, 1.2f, -0.4f, 0.9f, 0.0f, 2.0f};
  const Rows logits({row});
  for (const SamplingParams& s : {Sampling(1.0f), Sampling(0.7f, 3), Sampling(1.3f, 0, 0.8f)}) {
    for (uint64_t seed = 0; seed < 50; ++seed) {
      SequenceRng rng(seed), reference(seed);
      const VerifyResult r = MustVerify(CandidateTree(), logits, s, {}, rng);
      EXPECT_THAT(r.accepted_nodes, IsEmpty());
      EXPECT_EQ(r.bonus_token, SampleToken(row, s, reference));
    }
  }
}

TEST(VerifySampledTest, CertainTokensAreAlwaysAcceptedAndImpossibleOnesNever) {
  // top_k = 1 makes the target a point mass at its argmax (token 3), at temperature 1.
  CandidateTree tree;
  const int32_t j = tree.AddDistribution({0.2f, 0.2f, 0.2f, 0.2f, 0.2f});
  tree.AddNode(-1, 1, 0.2f, j);  // impossible under the target: always rejected
  tree.AddNode(-1, 3, 1.0f);     // the target's only token: always accepted
  tree.AddNode(1, 0, 0.2f, j);   // node 1's row is a point mass at 4: rejected, bonus 4
  const Rows logits({Row(5, {{3, 2.0f}}), Row(5, {}), Row(5, {{4, 1.0f}}), Row(5, {{2, 1.0f}})});
  for (uint64_t seed = 0; seed < 100; ++seed) {
    SequenceRng rng(seed);
    const VerifyResult r = MustVerify(tree, logits, Sampling(1.0f, 1), {}, rng);
    EXPECT_THAT(r.accepted_nodes, ElementsAre(1)) << seed;
    EXPECT_EQ(r.bonus_token, 4) << seed;
  }
}

// The same tree with every sparse distribution stored densely.
CandidateTree Densified(const CandidateTree& tree, int32_t vocab) {
  CandidateTree dense;
  for (int32_t j = 0; j < tree.num_distributions(); ++j) {
    std::vector<float> q(vocab, 0.0f);
    for (int32_t v = 0; v < vocab; ++v) q[v] = tree.ProposalProbability(j, v);
    dense.AddDistribution(std::move(q));
  }
  for (int32_t i = 0; i < tree.size(); ++i) {
    dense.AddNode(tree.parent(i), tree.token(i), tree.draft_prob(i), tree.proposal(i));
  }
  return dense;
}

TEST(VerifySampledTest, SparseProposalsVerifyExactlyAsTheSameProposalsStoredDensely) {
  // A tree of i.i.d. sampled siblings and chains below them, every proposal cut to its top 3 of 7
  // tokens, against random target rows: the same random stream gives the same accepted nodes and
  // bonus token whichever form the proposals take.
  constexpr int32_t kVocab = 7;
  int64_t accepted = 0, rejected_all = 0;
  for (uint64_t seed = 0; seed < 2000; ++seed) {
    SequenceRng gen(seed * 7919 + 3);
    auto random_probs = [&] {
      std::vector<float> p(kVocab);
      for (float& x : p) x = static_cast<float>(0.05 + gen.Uniform());
      const float total = std::accumulate(p.begin(), p.end(), 0.0f);
      for (float& x : p) x /= total;
      return p;
    };
    CandidateTree tree;
    const Proposal root = TopKProposal(random_probs(), 3);
    const int32_t j = AddProposal(tree, root);
    for (int32_t c = 0; c < 3; ++c) {
      const int32_t t = SampleProposal(root, gen);
      const int32_t node = tree.AddNode(-1, t, ProposalProbability(root, t), j);
      AddSampledNode(tree, node, random_probs(), 3, gen);
    }
    ASSERT_FALSE(tree.distribution_is_dense(0));
    const CandidateTree dense = Densified(tree, kVocab);
    std::vector<std::vector<float>> rows;
    for (int32_t r = 0; r <= tree.size(); ++r) {
      std::vector<float> row(kVocab);
      for (float& x : row) x = static_cast<float>(3.0 * gen.Uniform() - 1.5);
      rows.push_back(row);
    }
    const Rows logits(rows);
    for (const SamplingParams& s : {Sampling(1.0f), Sampling(0.7f, 4, 0.9f)}) {
      SequenceRng a(seed), b(seed);
      const VerifyResult sparse_result = MustVerify(tree, logits, s, {}, a);
      const VerifyResult dense_result = MustVerify(dense, logits, s, {}, b);
      ASSERT_EQ(sparse_result.accepted_nodes, dense_result.accepted_nodes) << "seed " << seed;
      ASSERT_EQ(sparse_result.bonus_token, dense_result.bonus_token) << "seed " << seed;
      // Both streams are at the same place afterwards.
      ASSERT_EQ(a.Uniform(), b.Uniform()) << "seed " << seed;
      accepted += static_cast<int64_t>(sparse_result.accepted_nodes.size());
      rejected_all += sparse_result.accepted_nodes.empty() ? 1 : 0;
    }
  }
  // Both acceptance and full rejection (the sparse residual) were exercised.
  EXPECT_GT(accepted, 1000);
  EXPECT_GT(rejected_all, 100);
}

// ---------------------------------------------------------------------------------------------
// SpecDec (lossy).

TEST(VerifySpecDecTest, AcceptsATopBetaTokenWithinTauThatGreedyRejects) {
  // Logits: token 3 first (2.0), token 1 second (1.5), token 0 third (1.2), token 4 fourth (1.1).
  const std::vector<float> row0 = {1.2f, 1.5f, 0.0f, 2.0f, 1.1f, -1.0f};
  const std::vector<float> row1 = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 3.0f};
  const Rows logits({row0, row1});
  const std::vector<int32_t> second = {1};
  const CandidateTree tree = CandidateTree::Chain(second);

  const VerifyResult greedy = MustVerify(tree, logits, Sampling(0.0f));
  EXPECT_THAT(greedy.accepted_nodes, IsEmpty());
  EXPECT_EQ(greedy.bonus_token, 3);

  VerifyParams specdec = Mode(VerifyMode::kSpecDec);  // beta 3, tau 1
  const VerifyResult relaxed = MustVerify(tree, logits, Sampling(0.0f), specdec);
  EXPECT_THAT(relaxed.accepted_nodes, ElementsAre(0));
  EXPECT_EQ(relaxed.bonus_token, 5);

  // Within tau but ranked 4th: rejected at beta 3, accepted at beta 4.
  const std::vector<int32_t> fourth = {4};
  const CandidateTree tree4 = CandidateTree::Chain(fourth);
  EXPECT_THAT(MustVerify(tree4, logits, Sampling(0.0f), specdec).accepted_nodes, IsEmpty());
  EXPECT_EQ(MustVerify(tree4, logits, Sampling(0.0f), specdec).bonus_token, 3);
  specdec.specdec_beta = 4;
  EXPECT_THAT(MustVerify(tree4, logits, Sampling(0.0f), specdec).accepted_nodes, ElementsAre(0));

  // In the top 3 but further than tau from the top: rejected.
  specdec.specdec_beta = 3;
  specdec.specdec_tau = 0.4f;
  EXPECT_THAT(MustVerify(tree, logits, Sampling(0.0f), specdec).accepted_nodes, IsEmpty());
}

TEST(VerifySpecDecTest, BetaOneEqualsGreedy) {
  CandidateTree tree;
  tree.AddNode(-1, 1);
  tree.AddNode(-1, 3);
  tree.AddNode(0, 2);
  tree.AddNode(1, 2);
  tree.AddNode(1, 0);
  tree.AddNode(3, 4);
  VerifyParams specdec = Mode(VerifyMode::kSpecDec);
  specdec.specdec_beta = 1;
  specdec.specdec_tau = 100.0f;
  // Many random logit sets: SpecDec with beta 1 must match lossless greedy exactly.
  SequenceRng gen(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<std::vector<float>> rows(tree.size() + 1, std::vector<float>(5));
    for (auto& row : rows) {
      for (float& l : row) l = static_cast<float>(std::floor(gen.Uniform() * 4.0));  // ties too
    }
    const Rows logits(rows);
    const VerifyResult greedy = MustVerify(tree, logits, Sampling(0.0f));
    const VerifyResult relaxed = MustVerify(tree, logits, Sampling(0.0f), specdec);
    EXPECT_EQ(relaxed.accepted_nodes, greedy.accepted_nodes) << trial;
    EXPECT_EQ(relaxed.bonus_token, greedy.bonus_token) << trial;
  }
}

TEST(VerifySpecDecTest, SampledRequestsDrawTheReplacementFromTheRequestDistribution) {
  const std::vector<float> row0 = {1.0f, 0.5f, -3.0f, 0.2f};
  const Rows logits({row0, Row(4, {})});
  const std::vector<int32_t> tokens = {2};  // far below the top: rejected
  const SamplingParams s = Sampling(0.9f, 3);
  for (uint64_t seed = 0; seed < 50; ++seed) {
    SequenceRng rng(seed), reference(seed);
    const VerifyResult r =
        MustVerify(CandidateTree::Chain(tokens), logits, s, Mode(VerifyMode::kSpecDec), rng);
    EXPECT_THAT(r.accepted_nodes, IsEmpty());
    EXPECT_EQ(r.bonus_token, SampleToken(row0, s, reference));
  }
}

// Sampled requests: the rule is evaluated on the shaped distribution (temperature, top-k, top-p).
TEST(VerifySpecDecTest, SampledRequestsUseTheShapedLogProbabilityGap) {
  // Logit gap 0.6 between token 0 (top) and token 1; at temperature T the shaped gap is 0.6 / T.
  const std::vector<float> row0 = {1.0f, 0.4f, -2.0f, -2.0f};
  const Rows logits({row0, Row(4, {})});
  const std::vector<int32_t> second = {1};
  const CandidateTree tree = CandidateTree::Chain(second);
  VerifyParams specdec = Mode(VerifyMode::kSpecDec);
  specdec.specdec_beta = 2;
  specdec.specdec_tau = 1.0f;
  // T = 1: gap 0.6 <= 1, accepted. T = 0.5: gap 1.2 > 1, rejected. T = 0.7: gap 0.857, accepted.
  EXPECT_THAT(MustVerify(tree, logits, Sampling(1.0f), specdec).accepted_nodes, ElementsAre(0));
  EXPECT_THAT(MustVerify(tree, logits, Sampling(0.5f), specdec).accepted_nodes, IsEmpty());
  EXPECT_THAT(MustVerify(tree, logits, Sampling(0.7f), specdec).accepted_nodes, ElementsAre(0));
  // Greedy requests keep the paper's rule on the raw log-probabilities: gap 0.6.
  EXPECT_THAT(MustVerify(tree, logits, Sampling(0.0f), specdec).accepted_nodes, ElementsAre(0));
  specdec.specdec_tau = 0.5f;
  EXPECT_THAT(MustVerify(tree, logits, Sampling(0.0f), specdec).accepted_nodes, IsEmpty());
}

TEST(VerifySpecDecTest, SampledRequestsNeverAcceptATokenTheShapingRemoved) {
  // Token 1 is second by logit and within any tau, but top_k = 1 (or a small top_p) removes it.
  const std::vector<float> row0 = {1.0f, 0.9f, -2.0f, -2.0f};
  const Rows logits({row0, Row(4, {})});
  const std::vector<int32_t> second = {1};
  const CandidateTree tree = CandidateTree::Chain(second);
  VerifyParams specdec = Mode(VerifyMode::kSpecDec);
  specdec.specdec_beta = 4;
  specdec.specdec_tau = 100.0f;
  EXPECT_THAT(MustVerify(tree, logits, Sampling(1.0f), specdec).accepted_nodes, ElementsAre(0));
  for (const SamplingParams& s : {Sampling(1.0f, 1), Sampling(1.0f, 0, 0.3f)}) {
    for (uint64_t seed = 0; seed < 20; ++seed) {
      SequenceRng rng(seed);
      const VerifyResult r = MustVerify(tree, logits, s, specdec, rng);
      EXPECT_THAT(r.accepted_nodes, IsEmpty());
      EXPECT_EQ(r.bonus_token, 0);  // the only token left in the shaped support
    }
  }
}

TEST(VerifySpecDecTest, SampledBetaOneAcceptsOnlyTheShapedMode) {
  const std::vector<float> row0 = {0.2f, 1.0f, 0.99f, -1.0f};
  const Rows logits({row0, Row(4, {})});
  VerifyParams specdec = Mode(VerifyMode::kSpecDec);
  specdec.specdec_beta = 1;
  specdec.specdec_tau = 100.0f;
  const std::vector<int32_t> mode = {1}, runner_up = {2};
  EXPECT_THAT(
      MustVerify(CandidateTree::Chain(mode), logits, Sampling(0.8f), specdec).accepted_nodes,
      ElementsAre(0));
  EXPECT_THAT(
      MustVerify(CandidateTree::Chain(runner_up), logits, Sampling(0.8f), specdec).accepted_nodes,
      IsEmpty());
}

// ---------------------------------------------------------------------------------------------
// Typical acceptance (lossy).

TEST(VerifyTypicalTest, AcceptsCandidatesAboveTheEntropyScaledThreshold) {
  // p = [0.5, 0.3, 0.15, 0.05]: H = 1.1422, 0.3 * exp(-H) = 0.0957, threshold min(0.09, .) = 0.09.
  const std::vector<float> row0 = LogitsOf({0.5, 0.3, 0.15, 0.05});
  const Rows logits({row0, Row(4, {{3, 5.0f}})});
  const VerifyParams typical = Mode(VerifyMode::kTypical);
  for (int32_t token : {0, 1, 2}) {
    const std::vector<int32_t> tokens = {token};
    SequenceRng rng(3);
    const VerifyResult r =
        MustVerify(CandidateTree::Chain(tokens), logits, Sampling(1.0f), typical, rng);
    EXPECT_THAT(r.accepted_nodes, ElementsAre(0)) << token;
    SequenceRng reference(3);
    EXPECT_EQ(r.bonus_token, SampleToken(logits.view().row(1), Sampling(1.0f), reference)) << token;
  }
  // Token 3 (p = 0.05) is rejected; the replacement comes from the request's distribution.
  const std::vector<int32_t> low = {3};
  for (uint64_t seed = 0; seed < 30; ++seed) {
    SequenceRng rng(seed), reference(seed);
    const VerifyResult r =
        MustVerify(CandidateTree::Chain(low), logits, Sampling(1.0f), typical, rng);
    EXPECT_THAT(r.accepted_nodes, IsEmpty());
    EXPECT_EQ(r.bonus_token, SampleToken(row0, Sampling(1.0f), reference));
  }
  // A smaller epsilon lets token 3 through (0.05 > 0.04).
  VerifyParams loose = typical;
  loose.typical_epsilon = 0.04f;
  EXPECT_THAT(MustVerify(CandidateTree::Chain(low), logits, Sampling(1.0f), loose).accepted_nodes,
              ElementsAre(0));
  // The first passing child in insertion order is taken, not the most likely one.
  CandidateTree siblings;
  siblings.AddNode(-1, 3);
  siblings.AddNode(-1, 2);
  siblings.AddNode(-1, 0);
  const Rows sibling_logits({row0, Row(4, {}), Row(4, {}), Row(4, {})});
  EXPECT_THAT(MustVerify(siblings, sibling_logits, Sampling(1.0f), typical).accepted_nodes,
              ElementsAre(1));
}

TEST(VerifyTypicalTest, TemperatureSharpensTheDistributionAndZeroIsGreedy) {
  // At temperature 1 p = [0.4, 0.35, 0.25]: token 2 passes. At temperature 0.1 p(2) ~ 0.007.
  const std::vector<float> row0 = LogitsOf({0.4, 0.35, 0.25});
  const Rows logits({row0, Row(3, {})});
  const std::vector<int32_t> tokens = {2};
  const CandidateTree tree = CandidateTree::Chain(tokens);
  const VerifyParams typical = Mode(VerifyMode::kTypical);
  EXPECT_THAT(MustVerify(tree, logits, Sampling(1.0f), typical).accepted_nodes, ElementsAre(0));
  EXPECT_THAT(MustVerify(tree, logits, Sampling(0.1f), typical).accepted_nodes, IsEmpty());
  const VerifyResult greedy = MustVerify(tree, logits, Sampling(0.0f), typical);
  EXPECT_THAT(greedy.accepted_nodes, IsEmpty());
  EXPECT_EQ(greedy.bonus_token, 0);
  const std::vector<int32_t> top = {0};
  EXPECT_THAT(MustVerify(CandidateTree::Chain(top), logits, Sampling(0.0f), typical).accepted_nodes,
              ElementsAre(0));
}

// ---------------------------------------------------------------------------------------------
// Lossy modes agree with lossless verification when the draft is the target's argmax path.

TEST(VerifyLossyTest, ArgmaxDraftGivesTheLosslessResult) {
  SequenceRng gen(11);
  constexpr int32_t kV = 7;
  for (int trial = 0; trial < 100; ++trial) {
    // Random rows; the chain follows their argmax, with an extra non-argmax sibling at each level.
    const int32_t depth = 1 + trial % 4;
    std::vector<std::vector<float>> rows;
    CandidateTree tree;
    rows.push_back(std::vector<float>(kV));
    for (float& l : rows.back()) l = static_cast<float>(4.0 * gen.Uniform());
    int32_t parent = -1;
    int32_t parent_row = 0;
    for (int32_t d = 0; d < depth; ++d) {
      const int32_t best = Argmax(rows[parent_row]);
      const int32_t node = tree.AddNode(parent, best);
      rows.push_back(std::vector<float>(kV));
      for (float& l : rows.back()) l = static_cast<float>(4.0 * gen.Uniform());
      const int32_t other = tree.AddNode(parent, (best + 1) % kV);
      rows.push_back(std::vector<float>(kV));
      parent = node;
      parent_row = node + 1;
      (void)other;
    }
    const Rows logits(rows);
    const VerifyResult lossless = MustVerify(tree, logits, Sampling(0.0f));
    ASSERT_EQ(static_cast<int32_t>(lossless.accepted_nodes.size()), depth);
    for (VerifyMode mode : {VerifyMode::kSpecDec, VerifyMode::kTypical}) {
      const VerifyResult lossy = MustVerify(tree, logits, Sampling(0.0f), Mode(mode));
      EXPECT_EQ(lossy.accepted_nodes, lossless.accepted_nodes) << VerifyModeName(mode);
      EXPECT_EQ(lossy.bonus_token, lossless.bonus_token) << VerifyModeName(mode);
      // Sampled requests: the whole argmax path is accepted and the bonus is plain sampling at the
      // leaf.
      const SamplingParams s = Sampling(0.8f, 5, 0.95f);
      SequenceRng rng(trial), reference(trial);
      const VerifyResult sampled = MustVerify(tree, logits, s, Mode(mode), rng);
      EXPECT_EQ(sampled.accepted_nodes, lossless.accepted_nodes) << VerifyModeName(mode);
      EXPECT_EQ(sampled.bonus_token,
                SampleToken(logits.view().row(lossless.accepted_nodes.back() + 1), s, reference))
          << VerifyModeName(mode);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Statistical losslessness.
//
// A small target "model" over 8 tokens whose logits depend only on the path after the pending
// token, and a drafter whose proposals q differ from it. For each scenario the test draws a tree
// (with its own random stream), lays out the target rows of its nodes, verifies it with a fresh
// seed, and records the first kTokens output tokens: the accepted tokens, then the bonus, then —
// when the step produced fewer — tokens drawn by the test from the target's exact conditional
// distributions (what the following steps would produce). Plain sampling gives the first kTokens
// tokens the distribution prod_d Probabilities(TargetRow(prefix_d)), computed exactly; a chi-square
// goodness-of-fit z-score compares the two.

constexpr int32_t kV = 8;
constexpr int64_t kTrials = 40000;
constexpr double kMaxZ = 5.0;

uint64_t PathHash(const std::vector<int32_t>& path) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t t : path) h = (h ^ static_cast<uint64_t>(t + 1)) * 1099511628211ull;
  return h;
}

std::vector<float> TargetRow(const std::vector<int32_t>& path) {
  std::vector<float> row(kV);
  if (path.empty()) return {1.0f, 2.0f, 0.5f, -0.5f, 1.5f, 0.0f, -1.0f, 0.8f};
  if (path.size() == 1) {
    for (int32_t v = 0; v < kV; ++v)
      row[v] = static_cast<float>(1.6 * std::sin(0.9 * path[0] + 1.7 * v + 0.3));
    return row;
  }
  const double phase = static_cast<double>(PathHash(path) % 1000) * 0.013;
  for (int32_t v = 0; v < kV; ++v) row[v] = static_cast<float>(1.4 * std::sin(phase + 1.1 * v));
  return row;
}

std::vector<float> Softmax(const std::vector<double>& logits) {
  const double m = *std::max_element(logits.begin(), logits.end());
  double total = 0.0;
  for (double l : logits) total += std::exp(l - m);
  std::vector<float> p;
  for (double l : logits) p.push_back(static_cast<float>(std::exp(l - m) / total));
  return p;
}

// The drafter's proposal after `path`: full support, clearly different from the target.
std::vector<float> DraftProbs(const std::vector<int32_t>& path) {
  if (path.empty()) return Softmax({2.0, 0.5, 1.0, 0.0, -0.5, 1.5, 0.2, -1.0});
  const double phase = static_cast<double>(PathHash(path) % 1000) * 0.0071;
  std::vector<double> logits(kV);
  for (int32_t v = 0; v < kV; ++v) logits[v] = 1.3 * std::cos(phase + 1.9 * v);
  return Softmax(logits);
}

std::vector<int32_t> TopK(const std::vector<float>& probs, int32_t k) {
  std::vector<int32_t> order(probs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return probs[a] > probs[b]; });
  order.resize(k);
  return order;
}

std::vector<int32_t> TokensTo(const CandidateTree& tree, int32_t node) {
  std::vector<int32_t> path;
  for (int32_t n : tree.PathTo(node)) path.push_back(tree.token(n));
  return path;
}

// Adds `count` children of `parent` drawn i.i.d. from the drafter's proposal at that node, cut to
// its top `top_k` tokens first (0 = dense) as a remote drafter cuts it (TopKProposal).
std::vector<int32_t> AddSampled(CandidateTree& tree, int32_t parent, int32_t count,
                                SequenceRng& rng, int32_t top_k = 0) {
  const Proposal q =
      TopKProposal(DraftProbs(parent < 0 ? std::vector<int32_t>{} : TokensTo(tree, parent)), top_k);
  const int32_t j = AddProposal(tree, q);
  std::vector<int32_t> nodes;
  for (int32_t c = 0; c < count; ++c) {
    const int32_t t = SampleProposal(q, rng);
    nodes.push_back(tree.AddNode(parent, t, ProposalProbability(q, t), j));
  }
  return nodes;
}

// Adds the drafter's top-`count` tokens at `parent` as deterministic children.
std::vector<int32_t> AddTopK(CandidateTree& tree, int32_t parent, int32_t count) {
  const std::vector<float> q =
      DraftProbs(parent < 0 ? std::vector<int32_t>{} : TokensTo(tree, parent));
  std::vector<int32_t> nodes;
  for (int32_t t : TopK(q, count)) nodes.push_back(tree.AddNode(parent, t, q[t]));
  return nodes;
}

// (a) A chain of 3, each token sampled from the drafter given the previous ones.
CandidateTree SampledChain(SequenceRng& rng) {
  CandidateTree tree;
  int32_t parent = -1;
  for (int32_t d = 0; d < 3; ++d) parent = AddSampled(tree, parent, 1, rng)[0];
  return tree;
}

// (b) 3 i.i.d. siblings at depth 1, 2 i.i.d. children under each, one sampled child below those.
CandidateTree SampledTree(SequenceRng& rng) {
  CandidateTree tree;
  for (int32_t a : AddSampled(tree, -1, 3, rng)) {
    for (int32_t b : AddSampled(tree, a, 2, rng)) AddSampled(tree, b, 1, rng);
  }
  return tree;
}

// (a) and (b) with every proposal cut to the drafter's top 3 of the 8 tokens (sparse).
constexpr int32_t kSparseTopK = 3;

CandidateTree SparseSampledChain(SequenceRng& rng) {
  CandidateTree tree;
  int32_t parent = -1;
  for (int32_t d = 0; d < 3; ++d) parent = AddSampled(tree, parent, 1, rng, kSparseTopK)[0];
  return tree;
}

CandidateTree SparseSampledTree(SequenceRng& rng) {
  CandidateTree tree;
  for (int32_t a : AddSampled(tree, -1, 3, rng, kSparseTopK)) {
    for (int32_t b : AddSampled(tree, a, 2, rng, kSparseTopK)) {
      AddSampled(tree, b, 1, rng, kSparseTopK);
    }
  }
  return tree;
}

// (c) Deterministic: the drafter's top 3 at depth 1, top 2 under each, top 1 below.
CandidateTree TopKTree(SequenceRng&) {
  CandidateTree tree;
  for (int32_t a : AddTopK(tree, -1, 3)) {
    for (int32_t b : AddTopK(tree, a, 2)) AddTopK(tree, b, 1);
  }
  return tree;
}

// (d) Mixed: the drafter's argmax plus 2 sampled siblings at depth 1; under each, a deterministic
// child then a sampled one, with a sampled chain below the sampled one.
CandidateTree MixedTree(SequenceRng& rng) {
  CandidateTree tree;
  std::vector<int32_t> first = AddTopK(tree, -1, 1);
  for (int32_t n : AddSampled(tree, -1, 2, rng)) first.push_back(n);
  for (int32_t a : first) {
    AddTopK(tree, a, 1);
    const int32_t b = AddSampled(tree, a, 1, rng)[0];
    AddSampled(tree, b, 1, rng);
  }
  return tree;
}

using TreeBuilder = std::function<CandidateTree(SequenceRng&)>;
using Verifier = std::function<StatusOr<VerifyResult>(const CandidateTree&, const TreeLogits&,
                                                      const SamplingParams&, SequenceRng&)>;

StatusOr<VerifyResult> Lossless(const CandidateTree& tree, const TreeLogits& logits,
                                const SamplingParams& sampling, SequenceRng& rng) {
  return VerifyTree(tree, logits, sampling, VerifyParams(), rng);
}

// A deliberately broken sampled verifier (its own implementation of recursive rejection sampling,
// plus one bug), to show that the statistical tests can fail.
enum class Bug {
  kBonusFromTarget,  // after rejecting every child, sample from p instead of the residual
  kRootProposal,     // accept with min(1, r/q) using the root's proposal at every depth
};

StatusOr<VerifyResult> Broken(Bug bug, const CandidateTree& tree, const TreeLogits& logits,
                              const SamplingParams& sampling, SequenceRng& rng) {
  VerifyResult result;
  int32_t node = -1;
  while (true) {
    const std::vector<float> p = Probabilities(logits.row(node + 1), sampling);
    const std::vector<int32_t> kids = tree.Children(node);
    if (kids.empty()) {
      result.bonus_token = SampleFrom(p, rng);
      return result;
    }
    std::vector<double> r(p.begin(), p.end());
    int32_t accepted = -1;
    for (int32_t child : kids) {
      const int32_t x = tree.token(child);
      int32_t j = tree.proposal(child);
      if (bug == Bug::kRootProposal && j >= 0) j = 0;
      std::vector<double> q(kV, 0.0);
      if (j < 0) {
        q[x] = 1.0;
      } else {
        for (int32_t v = 0; v < kV; ++v) q[v] = tree.ProposalProbability(j, v);
      }
      if (rng.Uniform() * q[x] < r[x]) {
        accepted = child;
        break;
      }
      double total = 0.0;
      for (int32_t v = 0; v < kV; ++v) total += std::max(0.0, r[v] - q[v]);
      if (total > 0.0) {
        for (int32_t v = 0; v < kV; ++v) r[v] = std::max(0.0, r[v] - q[v]) / total;
      }
    }
    if (accepted < 0) {
      const std::vector<float> residual(r.begin(), r.end());
      result.bonus_token = SampleFrom(bug == Bug::kBonusFromTarget ? p : residual, rng);
      return result;
    }
    result.accepted_nodes.push_back(accepted);
    node = accepted;
  }
}

Verifier BrokenVerifier(Bug bug) {
  return [bug](const CandidateTree& tree, const TreeLogits& logits, const SamplingParams& sampling,
               SequenceRng& rng) { return Broken(bug, tree, logits, sampling, rng); };
}

// Index of the first `k` tokens in base kV.
int64_t Cell(const std::vector<int32_t>& tokens, int32_t k) {
  int64_t cell = 0;
  for (int32_t i = 0; i < k; ++i) cell = cell * kV + tokens[i];
  return cell;
}

// Exact distribution of the first k tokens of plain sampling.
std::vector<double> ExactDistribution(const SamplingParams& sampling, int32_t k) {
  std::vector<double> probs(static_cast<size_t>(std::pow(kV, k)));
  std::vector<int32_t> prefix;
  std::function<void(double)> walk = [&](double mass) {
    if (static_cast<int32_t>(prefix.size()) == k) {
      probs[Cell(prefix, k)] = mass;
      return;
    }
    const std::vector<float> p = Probabilities(TargetRow(prefix), sampling);
    for (int32_t v = 0; v < kV; ++v) {
      if (p[v] <= 0.0f) continue;
      prefix.push_back(v);
      walk(mass * p[v]);
      prefix.pop_back();
    }
  };
  walk(1.0);
  return probs;
}

// Counts of the first k tokens over `trials` verification steps.
struct Histogram {
  std::vector<int64_t> first_two = std::vector<int64_t>(kV * kV, 0);
  std::vector<int64_t> first_three = std::vector<int64_t>(kV * kV * kV, 0);
  int64_t accepted = 0;  // accepted tokens in all, to show the scenario exercises acceptance
};

// Verifies a batch of trees at once (each with its own logits rows and random stream).
using BatchVerifier = std::function<std::vector<StatusOr<VerifyResult>>(
    const std::vector<CandidateTree>&, const std::vector<TreeLogits>&, const SamplingParams&,
    std::vector<SequenceRng>&)>;

BatchVerifier OneByOne(const Verifier& verify) {
  return [verify](const std::vector<CandidateTree>& trees, const std::vector<TreeLogits>& logits,
                  const SamplingParams& sampling, std::vector<SequenceRng>& rngs) {
    std::vector<StatusOr<VerifyResult>> results;
    for (size_t i = 0; i < trees.size(); ++i) {
      results.push_back(verify(trees[i], logits[i], sampling, rngs[i]));
    }
    return results;
  };
}

// The target rows of a tree: row 0 at the pending token, row i + 1 at node i.
std::vector<float> TreeRows(const CandidateTree& tree) {
  std::vector<float> data(static_cast<size_t>(tree.size() + 1) * kV, 0.0f);
  for (int32_t row = 0; row <= tree.size(); ++row) {
    const std::vector<float> logits =
        TargetRow(row == 0 ? std::vector<int32_t>{} : TokensTo(tree, row - 1));
    std::copy(logits.begin(), logits.end(), data.begin() + static_cast<size_t>(row) * kV);
  }
  return data;
}

void Collect(const TreeBuilder& build, const SamplingParams& sampling, const BatchVerifier& verify,
             uint64_t seed, int64_t trials, Histogram* hist) {
  constexpr int64_t kBatch = 1000;
  SequenceRng draft_rng(seed * 3 + 1), continuation_rng(seed * 5 + 2);
  for (int64_t first = 0; first < trials; first += kBatch) {
    const int64_t n = std::min(kBatch, trials - first);
    std::vector<CandidateTree> trees;
    std::vector<std::vector<float>> data;
    std::vector<TreeLogits> views;
    std::vector<SequenceRng> rngs;
    for (int64_t i = 0; i < n; ++i) {
      trees.push_back(build(draft_rng));
      data.push_back(TreeRows(trees.back()));
      rngs.emplace_back(seed * 1000003 + static_cast<uint64_t>(first + i));
    }
    for (int64_t i = 0; i < n; ++i) {
      views.push_back({.data = data[i].data(), .rows = trees[i].size() + 1, .vocab = kV});
    }
    const std::vector<StatusOr<VerifyResult>> results = verify(trees, views, sampling, rngs);
    ASSERT_EQ(results.size(), static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(results[i].ok()) << results[i].status();
      std::vector<int32_t> out;
      for (int32_t node : results[i]->accepted_nodes) out.push_back(trees[i].token(node));
      ASSERT_GE(results[i]->bonus_token, 0);
      ASSERT_LT(results[i]->bonus_token, kV);
      out.push_back(results[i]->bonus_token);
      hist->accepted += static_cast<int64_t>(results[i]->accepted_nodes.size());
      // What the following steps would add: plain sampling from the exact conditionals.
      while (out.size() < 3) {
        out.push_back(SampleFrom(Probabilities(TargetRow(out), sampling), continuation_rng));
      }
      ++hist->first_two[Cell(out, 2)];
      ++hist->first_three[Cell(out, 3)];
    }
  }
}

void Collect(const TreeBuilder& build, const SamplingParams& sampling, const Verifier& verify,
             uint64_t seed, int64_t trials, Histogram* hist) {
  Collect(build, sampling, OneByOne(verify), seed, trials, hist);
}

struct Fit {
  double z2 = 0.0;  // first two tokens
  double z3 = 0.0;  // first three tokens
  double accepted_per_step = 0.0;
};

Fit Goodness(const TreeBuilder& build, const SamplingParams& sampling, const BatchVerifier& verify,
             uint64_t seed, const char* label) {
  Histogram hist;
  Collect(build, sampling, verify, seed, kTrials, &hist);
  Fit fit;
  fit.z2 = ChiSquareZ(hist.first_two, ExactDistribution(sampling, 2), kTrials);
  fit.z3 = ChiSquareZ(hist.first_three, ExactDistribution(sampling, 3), kTrials);
  fit.accepted_per_step = static_cast<double>(hist.accepted) / kTrials;
  std::printf(
      "[ chi-square ] %-34s z(2 tokens) = %8.3f  z(3 tokens) = %8.3f  accepted/step = %.3f\n",
      label, fit.z2, fit.z3, fit.accepted_per_step);
  return fit;
}

Fit Goodness(const TreeBuilder& build, const SamplingParams& sampling, const Verifier& verify,
             uint64_t seed, const char* label) {
  return Goodness(build, sampling, OneByOne(verify), seed, label);
}

TEST(ChiSquareTest, ExactCountsFitAndImpossibleCountsDoNot) {
  const std::vector<double> p = {0.5, 0.25, 0.125, 0.125, 0.0};
  const std::vector<int64_t> exact = {5000, 2500, 1250, 1250, 0};
  EXPECT_LT(ChiSquareZ(exact, p, 10000), -3.0);  // far too good a fit
  const std::vector<int64_t> off = {5600, 2200, 1100, 1100, 0};
  EXPECT_GT(ChiSquareZ(off, p, 10000), 5.0);
  const std::vector<int64_t> impossible = {5000, 2500, 1250, 1249, 1};
  EXPECT_TRUE(std::isinf(ChiSquareZ(impossible, p, 10000)));
  // Cells with tiny expected counts are merged rather than blowing up the statistic.
  const std::vector<double> tiny = {0.998, 0.001, 0.001};
  const std::vector<int64_t> tiny_counts = {997, 2, 1};
  EXPECT_LT(ChiSquareZ(tiny_counts, tiny, 1000), 2.0);

  EXPECT_LT(ChiSquareTwoSampleZ(exact, exact), -3.0);
  EXPECT_GT(ChiSquareTwoSampleZ(exact, off), 5.0);
  // Different sample sizes, same distribution.
  const std::vector<int64_t> doubled = {10000, 5000, 2500, 2500, 0};
  EXPECT_LT(ChiSquareTwoSampleZ(exact, doubled), -3.0);
}

TEST(VerifyLosslessnessTest, SampledChain) {
  const Fit fit = Goodness(SampledChain, Sampling(1.0f), Lossless, 1, "sampled chain (a)");
  EXPECT_LT(fit.z2, kMaxZ);
  EXPECT_LT(fit.z3, kMaxZ);
  EXPECT_GT(fit.accepted_per_step, 0.5);
}

TEST(VerifyLosslessnessTest, IidSampledSiblings) {
  const Fit fit = Goodness(SampledTree, Sampling(1.0f), Lossless, 2, "i.i.d. sampled tree (b)");
  EXPECT_LT(fit.z2, kMaxZ);
  EXPECT_LT(fit.z3, kMaxZ);
  EXPECT_GT(fit.accepted_per_step, 0.5);
}

TEST(VerifyLosslessnessTest, DeterministicTopKSiblings) {
  // The drafter's top tokens are not the target's, so most steps reject at depth 1.
  const Fit fit = Goodness(TopKTree, Sampling(1.0f), Lossless, 3, "deterministic top-k tree (c)");
  EXPECT_LT(fit.z2, kMaxZ);
  EXPECT_LT(fit.z3, kMaxZ);
  EXPECT_GT(fit.accepted_per_step, 0.2);
}

TEST(VerifyLosslessnessTest, TemperatureTopKTopP) {
  const SamplingParams s = Sampling(0.8f, 5, 0.9f);
  const Fit mixed = Goodness(MixedTree, s, Lossless, 4, "mixed tree, T 0.8 k 5 p 0.9 (d)");
  EXPECT_LT(mixed.z2, kMaxZ);
  EXPECT_LT(mixed.z3, kMaxZ);
  EXPECT_GT(mixed.accepted_per_step, 0.5);
  const Fit chain = Goodness(SampledChain, s, Lossless, 5, "sampled chain, T 0.8 k 5 p 0.9");
  EXPECT_LT(chain.z2, kMaxZ);
  EXPECT_LT(chain.z3, kMaxZ);
}

TEST(VerifyLosslessnessTest, TopKSparseProposals) {
  // Proposals cut to 3 of 8 tokens: the drafter never proposes the other 5, and the target's
  // distribution is still reproduced exactly (the residual keeps their mass). Acceptance drops
  // (the drafter's top 3 are mostly not the target's; about 0.35 accepted per step against 0.78
  // and 1.14 dense) but stays well above zero, so acceptance is exercised.
  const Fit chain =
      Goodness(SparseSampledChain, Sampling(1.0f), Lossless, 7, "top-3 sparse sampled chain");
  EXPECT_LT(chain.z2, kMaxZ);
  EXPECT_LT(chain.z3, kMaxZ);
  EXPECT_GT(chain.accepted_per_step, 0.25);
  const Fit tree =
      Goodness(SparseSampledTree, Sampling(1.0f), Lossless, 8, "top-3 sparse sampled tree");
  EXPECT_LT(tree.z2, kMaxZ);
  EXPECT_LT(tree.z3, kMaxZ);
  EXPECT_GT(tree.accepted_per_step, 0.25);
  const Fit shaped = Goodness(SparseSampledTree, Sampling(0.8f, 5, 0.9f), Lossless, 9,
                              "top-3 sparse tree, T 0.8 k 5 p 0.9");
  EXPECT_LT(shaped.z2, kMaxZ);
  EXPECT_LT(shaped.z3, kMaxZ);
  // The same statistic catches a broken verifier with sparse proposals.
  const Fit broken = Goodness(SparseSampledTree, Sampling(1.0f),
                              BrokenVerifier(Bug::kBonusFromTarget), 8, "BROKEN bonus, top-3 tree");
  EXPECT_GT(broken.z2, kMaxZ);
}

TEST(VerifyLosslessnessTest, BrokenVerifiersFail) {
  const Fit bonus = Goodness(SampledChain, Sampling(1.0f), BrokenVerifier(Bug::kBonusFromTarget), 1,
                             "BROKEN bonus from p, chain");
  EXPECT_GT(bonus.z2, kMaxZ);
  const Fit tree_bonus =
      Goodness(SampledTree, Sampling(1.0f), BrokenVerifier(Bug::kBonusFromTarget), 2,
               "BROKEN bonus from p, tree");
  EXPECT_GT(tree_bonus.z2, kMaxZ);
  const Fit topk_bonus = Goodness(TopKTree, Sampling(1.0f), BrokenVerifier(Bug::kBonusFromTarget),
                                  3, "BROKEN bonus from p, top-k tree");
  EXPECT_GT(topk_bonus.z2, kMaxZ);
  const Fit mixed_bonus =
      Goodness(MixedTree, Sampling(0.8f, 5, 0.9f), BrokenVerifier(Bug::kBonusFromTarget), 4,
               "BROKEN bonus from p, mixed tree (d)");
  EXPECT_GT(mixed_bonus.z2, kMaxZ);
  const Fit root_q = Goodness(SampledChain, Sampling(1.0f), BrokenVerifier(Bug::kRootProposal), 1,
                              "BROKEN q from the root, chain");
  EXPECT_GT(root_q.z2, kMaxZ);
}

TEST(VerifyLosslessnessTest, TwoSampleAgainstPlainSampling) {
  // The same check against plain sampling draws instead of the exact distribution.
  const SamplingParams s = Sampling(1.0f);
  SequenceRng plain_rng(99);
  std::vector<int64_t> plain(kV * kV, 0);
  for (int64_t i = 0; i < kTrials; ++i) {
    std::vector<int32_t> out;
    while (out.size() < 2) out.push_back(SampleToken(TargetRow(out), s, plain_rng));
    ++plain[Cell(out, 2)];
  }
  Histogram good, broken;
  Collect(SampledTree, s, Lossless, 6, kTrials, &good);
  Collect(SampledTree, s, BrokenVerifier(Bug::kBonusFromTarget), 6, kTrials, &broken);
  const double z_good = ChiSquareTwoSampleZ(good.first_two, plain);
  const double z_broken = ChiSquareTwoSampleZ(broken.first_two, plain);
  std::printf("[ chi-square ] two-sample, tree (b): lossless z = %.3f, BROKEN z = %.3f\n", z_good,
              z_broken);
  EXPECT_LT(z_good, kMaxZ);
  EXPECT_GT(z_broken, kMaxZ);
}

// ---------------------------------------------------------------------------------------------
// The tensor verifier (tensor_verifier.h) against the host verifier as the oracle.

at::Tensor StackRows(const std::vector<TreeLogits>& logits, std::vector<int64_t>* first_rows) {
  std::vector<float> all;
  int64_t vocab = logits.empty() ? 1 : logits[0].vocab;
  for (const TreeLogits& l : logits) {
    first_rows->push_back(static_cast<int64_t>(all.size()) / vocab);
    all.insert(all.end(), l.data, l.data + l.rows * l.vocab);
  }
  // On the test device (SPECULA_TEST_DEVICE): on a GPU machine the same oracles check CUDA.
  return at::tensor(all).view({-1, vocab}).to(TestDevice());
}

std::vector<StatusOr<VerifyResult>> OnTensors(const std::vector<CandidateTree>& trees,
                                              const std::vector<TreeLogits>& logits,
                                              const SamplingParams& sampling,
                                              std::vector<SequenceRng>& rngs) {
  std::vector<int64_t> first_rows;
  const at::Tensor stacked = StackRows(logits, &first_rows);
  std::vector<TreeVerifyJob> jobs;
  for (size_t i = 0; i < trees.size(); ++i) {
    jobs.push_back(
        {.tree = &trees[i], .first_row = first_rows[i], .sampling = sampling, .rng = &rngs[i]});
  }
  return VerifyTreesOnTensors(stacked, jobs);
}

// A random tree of `nodes` nodes over `vocab` tokens: each node under a random earlier node (or
// the root), deterministic or sampled from a random proposal.
CandidateTree RandomTree(std::mt19937& gen, int32_t nodes, int32_t vocab, bool sampled) {
  CandidateTree tree;
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (int32_t i = 0; i < nodes; ++i) {
    const int32_t parent = std::uniform_int_distribution<int32_t>(-1, i - 1)(gen);
    const int32_t t = token(gen);
    int32_t proposal = -1;
    if (sampled && unit(gen) < 0.6f) {
      std::vector<float> q(vocab);
      for (float& v : q) v = unit(gen) < 0.3f ? 0.0f : unit(gen);
      q[t] = 0.05f + unit(gen);
      proposal = tree.AddDistribution(std::move(q));
    }
    tree.AddNode(parent, t, 1.0f, proposal);
  }
  return tree;
}

TEST(TensorVerifierTest, GreedyEqualsTheHostVerifierOnRandomTrees) {
  std::mt19937 gen(7);
  for (int32_t vocab : {2, 5, 64}) {
    std::vector<CandidateTree> trees;
    std::vector<std::vector<float>> data;
    std::vector<TreeLogits> views;
    for (int32_t t = 0; t < 200; ++t) {
      trees.push_back(RandomTree(gen, t % 13, vocab, /*sampled=*/false));
      std::vector<float> rows(static_cast<size_t>(trees.back().size() + 1) * vocab);
      // Coarse values so that ties happen: both verifiers take the lower id.
      for (float& v : rows) v = static_cast<float>(gen() % 4);
      data.push_back(std::move(rows));
    }
    for (size_t i = 0; i < trees.size(); ++i) {
      views.push_back({.data = data[i].data(), .rows = trees[i].size() + 1, .vocab = vocab});
    }
    std::vector<SequenceRng> rngs(trees.size(), SequenceRng(1));
    const auto results = OnTensors(trees, views, Sampling(0.0f), rngs);
    int64_t accepted = 0;
    for (size_t i = 0; i < trees.size(); ++i) {
      ASSERT_TRUE(results[i].ok()) << results[i].status();
      SequenceRng rng(1);
      const auto oracle = VerifyTree(trees[i], views[i], Sampling(0.0f), VerifyParams(), rng);
      ASSERT_TRUE(oracle.ok());
      EXPECT_EQ(results[i]->accepted_nodes, oracle->accepted_nodes)
          << "vocab " << vocab << " tree " << i;
      EXPECT_EQ(results[i]->bonus_token, oracle->bonus_token) << "vocab " << vocab << " tree " << i;
      accepted += static_cast<int64_t>(oracle->accepted_nodes.size());
    }
    if (vocab <= 5) {
      EXPECT_GT(accepted, 50);  // the comparison covers accepted paths
    }
  }
}

TEST(TensorVerifierTest, ShapedProbabilitiesEqualProbabilities) {
  std::mt19937 gen(11);
  constexpr int64_t kVocab = 50;
  std::vector<float> rows;
  std::vector<double> temperature, top_p;
  std::vector<int64_t> top_k;
  std::vector<SamplingParams> params;
  for (float t : {0.3f, 1.0f, 1.7f}) {
    for (int32_t k : {0, 1, 5, 49, 50, 60}) {
      for (float p : {1.0f, 0.9f, 0.5f, 0.01f}) {
        for (int32_t tie = 0; tie < 2; ++tie) {
          for (int64_t v = 0; v < kVocab; ++v) {
            // Half the rows use a few distinct values, so that ties decide top-k and top-p.
            rows.push_back(tie ? static_cast<float>(gen() % 3)
                               : std::normal_distribution<float>(0.0f, 2.0f)(gen));
          }
          params.push_back(Sampling(t, k, p));
          temperature.push_back(t);
          top_k.push_back(k);
          top_p.push_back(p);
        }
      }
    }
  }
  const int64_t n = static_cast<int64_t>(params.size());
  const at::Tensor logits = at::tensor(rows).view({n, kVocab}).to(TestDevice());
  const at::Tensor shaped = ShapedProbabilities(logits, temperature, top_k, top_p).cpu();
  ASSERT_EQ(shaped.size(0), n);
  const auto a = shaped.accessor<float, 2>();
  for (int64_t r = 0; r < n; ++r) {
    const std::vector<float> expected =
        Probabilities(std::span<const float>(rows.data() + r * kVocab, kVocab), params[r]);
    for (int64_t v = 0; v < kVocab; ++v) {
      ASSERT_NEAR(a[r][v], expected[v], 1e-6)
          << "row " << r << " token " << v << " T " << params[r].temperature << " k "
          << params[r].top_k << " p " << params[r].top_p;
    }
  }
}

TEST(TensorVerifierTest, OneBadJobFailsAloneAndSeedsReproduce) {
  std::vector<CandidateTree> trees = {CandidateTree::Chain(std::vector<int32_t>{1, 2}),
                                      CandidateTree::Chain(std::vector<int32_t>{1, kV + 3}),
                                      CandidateTree::Chain(std::vector<int32_t>{3})};
  std::vector<std::vector<float>> data;
  std::vector<TreeLogits> views;
  for (const CandidateTree& tree : trees)
    data.push_back(std::vector<float>((tree.size() + 1) * kV, 0.5f));
  for (size_t i = 0; i < trees.size(); ++i) {
    views.push_back({.data = data[i].data(), .rows = trees[i].size() + 1, .vocab = kV});
  }
  std::vector<SequenceRng> rngs(3, SequenceRng(5));
  const auto results = OnTensors(trees, views, Sampling(1.0f), rngs);
  ASSERT_TRUE(results[0].ok()) << results[0].status();
  EXPECT_EQ(results[1].status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(results[1].status().message(), HasSubstr("token"));
  ASSERT_TRUE(results[2].ok()) << results[2].status();
  // Rows past the logits are refused for that job only.
  std::vector<int64_t> first_rows;
  const at::Tensor stacked = StackRows({views[0]}, &first_rows);
  std::vector<SequenceRng> again(2, SequenceRng(5));
  const std::vector<TreeVerifyJob> jobs = {
      {.tree = &trees[0], .first_row = 0, .sampling = Sampling(1.0f), .rng = &again[0]},
      {.tree = &trees[2], .first_row = 2, .sampling = Sampling(1.0f), .rng = &again[1]}};
  const auto second = VerifyTreesOnTensors(stacked, jobs);
  ASSERT_TRUE(second[0].ok());
  EXPECT_EQ(second[1].status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(second[1].status().message(), HasSubstr("rows"));
  // The same seed and tree give the same tokens.
  EXPECT_EQ(second[0]->accepted_nodes, results[0]->accepted_nodes);
  EXPECT_EQ(second[0]->bonus_token, results[0]->bonus_token);
}

TEST(TensorVerifierTest, MixedBatchKeepsEachJobsOwnSamplingParameters) {
  // One call with greedy, T = 1 and sharply truncated jobs: top_k 1 must behave as greedy.
  const std::vector<float> row = TargetRow({});
  const int32_t argmax = Argmax(row);
  std::vector<float> data;
  for (int32_t r = 0; r < 3; ++r) data.insert(data.end(), row.begin(), row.end());
  const at::Tensor logits = at::tensor(data).view({3, kV}).to(TestDevice());
  const CandidateTree empty;
  std::vector<SequenceRng> rngs(3, SequenceRng(3));
  for (int32_t trial = 0; trial < 50; ++trial) {
    std::vector<TreeVerifyJob> jobs = {
        {.tree = &empty, .first_row = 0, .sampling = Sampling(0.0f), .rng = &rngs[0]},
        {.tree = &empty, .first_row = 1, .sampling = Sampling(1.0f, 1), .rng = &rngs[1]},
        {.tree = &empty, .first_row = 2, .sampling = Sampling(5.0f, 0, 0.01f), .rng = &rngs[2]}};
    const auto results = VerifyTreesOnTensors(logits, jobs);
    for (const auto& r : results) {
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->bonus_token, argmax);
    }
  }
}

TEST(TensorVerifierTest, ChainFastPathEqualsTheTreeWalk) {
  // A batch of chains only takes the all-depths-at-once path; one branching tree in the batch
  // sends every job through the level-by-level walk. Same uniforms, so the same results.
  std::mt19937 gen(5);
  std::vector<CandidateTree> trees;
  for (int32_t t = 0; t < 300; ++t) {
    SequenceRng draft(gen());
    trees.push_back(t % 3 == 0 ? CandidateTree() : SampledChain(draft));
  }
  std::vector<std::vector<float>> data;
  std::vector<TreeLogits> views;
  for (const CandidateTree& tree : trees) data.push_back(TreeRows(tree));
  SequenceRng branching_rng(1);
  const CandidateTree branching = SampledTree(branching_rng);
  data.push_back(TreeRows(branching));
  for (size_t i = 0; i < trees.size(); ++i) {
    views.push_back({.data = data[i].data(), .rows = trees[i].size() + 1, .vocab = kV});
  }
  std::vector<SequenceRng> chain_rngs, walk_rngs;
  for (size_t i = 0; i <= trees.size(); ++i) {
    chain_rngs.emplace_back(100 + i);
    walk_rngs.emplace_back(100 + i);
  }
  chain_rngs.pop_back();
  const auto chains = OnTensors(trees, views, Sampling(1.0f), chain_rngs);
  std::vector<CandidateTree> with_tree = trees;
  with_tree.push_back(branching);
  views.push_back({.data = data.back().data(), .rows = branching.size() + 1, .vocab = kV});
  const auto walked = OnTensors(with_tree, views, Sampling(1.0f), walk_rngs);
  int64_t accepted = 0;
  for (size_t i = 0; i < trees.size(); ++i) {
    ASSERT_TRUE(chains[i].ok() && walked[i].ok());
    EXPECT_EQ(chains[i]->accepted_nodes, walked[i]->accepted_nodes) << i;
    EXPECT_EQ(chains[i]->bonus_token, walked[i]->bonus_token) << i;
    accepted += static_cast<int64_t>(chains[i]->accepted_nodes.size());
  }
  EXPECT_GT(accepted, 100);
}

TEST(TensorVerifierTest, SparseProposalsVerifyExactlyAsTheSameProposalsStoredDensely) {
  // Top-k proposals (the wire form) reach the tensors through their support only.
  for (const TreeBuilder& build :
       {TreeBuilder(SparseSampledChain), TreeBuilder(SparseSampledTree)}) {
    SequenceRng draft(3);
    std::vector<CandidateTree> sparse, dense;
    std::vector<std::vector<float>> data;
    std::vector<TreeLogits> views;
    for (int32_t t = 0; t < 200; ++t) {
      sparse.push_back(build(draft));
      dense.push_back(Densified(sparse.back(), kV));
      data.push_back(TreeRows(sparse.back()));
    }
    for (size_t i = 0; i < sparse.size(); ++i) {
      views.push_back({.data = data[i].data(), .rows = sparse[i].size() + 1, .vocab = kV});
    }
    std::vector<SequenceRng> a, b;
    for (size_t i = 0; i < sparse.size(); ++i) {
      a.emplace_back(7 + i);
      b.emplace_back(7 + i);
    }
    const auto from_sparse = OnTensors(sparse, views, Sampling(1.0f), a);
    const auto from_dense = OnTensors(dense, views, Sampling(1.0f), b);
    for (size_t i = 0; i < sparse.size(); ++i) {
      ASSERT_TRUE(from_sparse[i].ok()) << from_sparse[i].status();
      ASSERT_TRUE(from_dense[i].ok()) << from_dense[i].status();
      EXPECT_EQ(from_sparse[i]->accepted_nodes, from_dense[i]->accepted_nodes) << i;
      EXPECT_EQ(from_sparse[i]->bonus_token, from_dense[i]->bonus_token) << i;
    }
  }
}

TEST(TensorVerifierLosslessnessTest, EveryScenarioKeepsTheTargetDistribution) {
  struct Scenario {
    TreeBuilder build;
    SamplingParams sampling;
    const char* label;
  };
  const std::vector<Scenario> scenarios = {
      {SampledChain, Sampling(1.0f), "tensors: sampled chain (a)"},
      {SampledTree, Sampling(1.0f), "tensors: i.i.d. sampled tree (b)"},
      {TopKTree, Sampling(1.0f), "tensors: deterministic top-k tree (c)"},
      {MixedTree, Sampling(0.8f, 5, 0.9f), "tensors: mixed tree, T 0.8 k 5 p 0.9"},
      {SampledChain, Sampling(0.8f, 5, 0.9f), "tensors: chain, T 0.8 k 5 p 0.9"},
      {SparseSampledChain, Sampling(1.0f), "tensors: top-3 sparse chain"},
      {SparseSampledTree, Sampling(1.0f), "tensors: top-3 sparse tree"}};
  uint64_t seed = 21;
  for (const Scenario& s : scenarios) {
    const Fit fit = Goodness(s.build, s.sampling, BatchVerifier(OnTensors), seed++, s.label);
    EXPECT_LT(fit.z2, kMaxZ) << s.label;
    EXPECT_LT(fit.z3, kMaxZ) << s.label;
    EXPECT_GT(fit.accepted_per_step, 0.2) << s.label;
  }
}

}  // namespace
}  // namespace specula
