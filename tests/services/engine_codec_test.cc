// The engine codec: candidate trees (drafter.proto), whose sparse and dense proposal
// distributions round-trip exactly, a malformed one from a peer being INVALID_ARGUMENT naming the
// field, the sparse form being what makes a sampled node cheap on the wire; and step results,
// whose finish reasons travel as their names (FinishReasonName), so the field's wire format is what
// it was when it carried strings, an unknown name ending that request alone with INVALID_ARGUMENT
// naming the field.
#include "services/common/engine_codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common/spec/proposal.h"

namespace specula::services {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::vector<int32_t> Ids(const CandidateTree& t, int32_t j) {
  return {t.distribution_ids(j).begin(), t.distribution_ids(j).end()};
}
std::vector<float> Values(const CandidateTree& t, int32_t j) {
  return {t.distribution(j).begin(), t.distribution(j).end()};
}

TEST(EngineCodecTest, SparseAndDenseDistributionsRoundTrip) {
  CandidateTree tree;
  const int32_t dense = tree.AddDistribution({0.1f, 0.2f, 0.3f, 0.4f, 0.0f});
  const int32_t sparse = tree.AddSparseDistribution({1, 4}, {0.25f, 0.75f});
  tree.AddNode(-1, 4, 0.75f, sparse);
  tree.AddNode(0, 2, 0.3f, dense);
  tree.AddNode(0, 0, 0.5f);
  v1::CandidateTree m;
  ASSERT_TRUE(ToProto(tree, &m).ok());
  EXPECT_EQ(m.distributions_size(), 0) << "the old dense tensors are never written";
  ASSERT_EQ(m.proposal_distributions_size(), 2);
  EXPECT_THAT(m.proposal_distributions(0).ids(), IsEmpty());
  EXPECT_THAT(m.proposal_distributions(1).ids(), ElementsAre(1, 4));

  auto back = FromProto(m, 5, "tree");
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_TRUE(back->Validate(5, 10, 10).ok()) << back->Validate(5, 10, 10);
  EXPECT_EQ(back->tokens(), tree.tokens());
  EXPECT_EQ(back->parents(), tree.parents());
  ASSERT_EQ(back->num_distributions(), 2);
  EXPECT_THAT(Ids(*back, 0), IsEmpty());
  EXPECT_THAT(Values(*back, 0), ElementsAre(0.1f, 0.2f, 0.3f, 0.4f, 0.0f));
  EXPECT_THAT(Ids(*back, 1), ElementsAre(1, 4));
  EXPECT_THAT(Values(*back, 1), ElementsAre(0.25f, 0.75f));
  for (int32_t i = 0; i < tree.size(); ++i) {
    EXPECT_EQ(back->proposal(i), tree.proposal(i));
    EXPECT_EQ(back->draft_prob(i), tree.draft_prob(i));
  }
}

TEST(EngineCodecTest, OldDenseTensorsAreStillRead) {
  v1::CandidateTree m;
  m.add_tokens(1);
  m.add_parents(-1);
  m.add_draft_probs(0.5f);
  m.add_proposals(0);
  const std::vector<float> q = {0.5f, 0.5f, 0.0f};
  v1::Tensor* t = m.add_distributions();
  t->set_dtype(v1::DTYPE_FLOAT32);
  t->add_shape(3);
  t->set_data(q.data(), q.size() * sizeof(float));
  auto back = FromProto(m, 3, "tree");
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->num_distributions(), 1);
  EXPECT_THAT(Ids(*back, 0), IsEmpty());
  EXPECT_THAT(Values(*back, 0), ElementsAreArray(q));
  EXPECT_TRUE(back->Validate(3, 1, 1).ok());

  // Their values follow the same rules as proposal_distributions' (found by codec_fuzz: a
  // negative value was read from the old form and refused only after a re-encode).
  for (const auto& [bad, why] : std::vector<std::pair<std::vector<float>, std::string>>{
           {{0.5f, -0.25f, 0.75f}, "tree.distributions[0].data[1] = -0.25 is not a probability"},
           {{std::numeric_limits<float>::quiet_NaN(), 0.5f, 0.5f},
            "tree.distributions[0].data[0] = nan is not a probability"},
           {{0.0f, 0.0f, 0.0f}, "tree.distributions[0].data sum to 0"}}) {
    v1::CandidateTree b = m;
    b.mutable_distributions(0)->set_data(bad.data(), bad.size() * sizeof(float));
    auto refused = FromProto(b, 3, "tree");
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << why;
    EXPECT_THAT(refused.status().message(), HasSubstr(why));
  }

  // Both forms at once is ambiguous.
  m.add_proposal_distributions()->add_probs(1.0f);
  auto both = FromProto(m, 3, "tree");
  EXPECT_EQ(both.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(both.status().message(),
              HasSubstr("tree: both distributions (1) and proposal_distributions (1) are set"));
}

TEST(EngineCodecTest, MalformedProposalDistributionsAreInvalidArgumentNamingTheField) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    std::vector<int32_t> ids;
    std::vector<float> probs;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {{1, 2}, {0.5f}, "t.proposal_distributions[1]: 2 ids but 1 probs"},
           {{}, {0.5f, 0.5f}, "t.proposal_distributions[1].probs: 2 entries with no ids"},
           {{1, 8},
            {0.5f, 0.5f},
            "t.proposal_distributions[1].ids[1] = 8 is outside the vocabulary [0, 8)"},
           {{-3}, {1.0f}, "t.proposal_distributions[1].ids[0] = -3 is outside"},
           {{2, 2}, {0.5f, 0.5f}, "t.proposal_distributions[1].ids[1] = 2 repeats"},
           {{4, 2}, {0.5f, 0.5f}, "t.proposal_distributions[1].ids[1] = 2 is out of order"},
           {{1, 2},
            {0.5f, -0.5f},
            "t.proposal_distributions[1].probs[1] = -0.5 is not a probability"},
           {{1, 2}, {nan, 0.5f}, "t.proposal_distributions[1].probs[0] = nan"},
           {{1, 2}, {0.5f, inf}, "t.proposal_distributions[1].probs[1] = inf"},
           {{1, 2},
            {1.5f, 0.5f},
            "t.proposal_distributions[1].probs[0] = 1.5 is not a probability "
            "(in [0, 1])"},
           {{1, 2}, {0.0f, 0.0f}, "t.proposal_distributions[1].probs sum to 0"},
           {{}, std::vector<float>(8, 0.0f), "t.proposal_distributions[1].probs sum to 0"},
           {{},
            {0.5f, 0.5f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, -1.0f},
            "t.proposal_distributions[1].probs[7] = -1 is not a probability (finite and >= 0)"},
       }) {
    v1::CandidateTree m;
    m.add_tokens(1);
    m.add_parents(-1);
    m.add_draft_probs(0.5f);
    m.add_proposals(0);
    v1::ProposalDistribution* good = m.add_proposal_distributions();
    good->add_ids(1);
    good->add_probs(1.0f);
    v1::ProposalDistribution* bad = m.add_proposal_distributions();
    bad->mutable_ids()->Assign(c.ids.begin(), c.ids.end());
    bad->mutable_probs()->Assign(c.probs.begin(), c.probs.end());
    auto out = FromProto(m, 8, "t");
    EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(out.status().message(), HasSubstr(c.message));
  }
}

// Bytes of one sampled node's proposal on the wire, dense (the old float32 tensor and the dense
// ProposalDistribution) against top-k sparse, for the bundled models' vocabulary (4096) and a
// Llama-3-sized one. Printed for docs/BENCHMARKS.md.
TEST(EngineCodecTest, TopKSparseProposalsAreSmallOnTheWire) {
  for (const int32_t vocab : {4096, 128256}) {
    // Probabilities decaying with a rank that scatters the likeliest tokens over the vocabulary
    // (7919 is prime to both sizes), so ids take their realistic varint sizes.
    std::vector<float> p(static_cast<size_t>(vocab));
    double total = 0.0;
    for (int32_t v = 0; v < vocab; ++v) {
      const int64_t rank = (int64_t{v} * 7919) % vocab;
      total += p[v] = static_cast<float>(std::exp(-0.01 * static_cast<double>(rank)));
    }
    for (float& x : p) x = static_cast<float>(x / total);
    auto node_bytes = [&](int32_t k) {
      CandidateTree tree;
      SequenceRng rng(1);
      AddSampledNode(tree, -1, p, k, rng);
      v1::CandidateTree m;
      EXPECT_TRUE(ToProto(tree, &m).ok());
      return static_cast<int64_t>(m.ByteSizeLong());
    };
    v1::Tensor old;
    old.set_dtype(v1::DTYPE_FLOAT32);
    old.add_shape(vocab);
    old.set_data(p.data(), p.size() * sizeof(float));
    const int64_t old_bytes = static_cast<int64_t>(old.ByteSizeLong());
    const int64_t dense = node_bytes(0), k64 = node_bytes(64), k16 = node_bytes(16);
    std::printf(
        "[ wire bytes ] vocab %6d: sampled node dense %7lld (old Tensor %7lld), top-64 %5lld, "
        "top-16 %5lld\n",
        vocab, static_cast<long long>(dense), static_cast<long long>(old_bytes),
        static_cast<long long>(k64), static_cast<long long>(k16));
    EXPECT_GT(dense, int64_t{4} * vocab);
    EXPECT_LT(k64, 64 * 8 + 32);  // 4 bytes a prob, at most 3 a varint id, small framing
    EXPECT_LT(k16, k64);
  }
}

TEST(EngineCodecTest, AStepsMeasurementsRoundTrip) {
  StepOutcome outcome{.kv_blocks_used = 17, .step_seconds = 4e-3};
  outcome.report = {.batch_size = 5,
                    .prefill_tokens = 64,
                    .verify_tokens = 9,
                    .draft_seconds = 1e-4,
                    .verify_seconds = 3e-3,
                    .forward_seconds = 2.5e-3,
                    .attention = 4096.0 + 900.0,
                    .prefill_attention = 4096.0};
  v1::StepResult message;
  ToProto(outcome, &message);
  const StepOutcome back = FromProto(message);
  EXPECT_EQ(back.report.batch_size, 5);
  EXPECT_EQ(back.report.prefill_tokens, 64);
  EXPECT_EQ(back.report.verify_tokens, 9);
  EXPECT_DOUBLE_EQ(back.report.draft_seconds, 1e-4);
  EXPECT_DOUBLE_EQ(back.report.verify_seconds, 3e-3);
  EXPECT_DOUBLE_EQ(back.report.forward_seconds, 2.5e-3);
  EXPECT_DOUBLE_EQ(back.report.attention, 4996.0);
  EXPECT_DOUBLE_EQ(back.report.prefill_attention, 4096.0);
  EXPECT_DOUBLE_EQ(back.step_seconds, 4e-3);
  EXPECT_EQ(back.kv_blocks_used, 17);
}

TEST(EngineCodecTest, FinishReasonsRoundTripAsTheirNames) {
  StepOutcome outcome;
  for (FinishReason r : {FinishReason::kStop, FinishReason::kLength, FinishReason::kCancelled,
                         FinishReason::kError}) {
    outcome.report.updates.push_back(
        {.id = static_cast<RequestId>(outcome.report.updates.size() + 1),
         .finished = true,
         .finish_reason = r,
         .error = r == FinishReason::kError ? InternalError("boom") : OkStatus()});
  }
  outcome.report.updates.push_back({.id = 9, .new_tokens = {5, 6}});  // not finished
  v1::StepResult message;
  ToProto(outcome, &message);
  ASSERT_EQ(message.updates_size(), 5);
  EXPECT_EQ(message.updates(0).finish_reason(), "stop");
  EXPECT_EQ(message.updates(1).finish_reason(), "length");
  EXPECT_EQ(message.updates(2).finish_reason(), "cancelled");
  EXPECT_EQ(message.updates(3).finish_reason(), "error");
  EXPECT_EQ(message.updates(4).finish_reason(), "");  // as before: only finished updates name one

  StepOutcome back = FromProto(message);
  ASSERT_EQ(back.report.updates.size(), 5u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(back.report.updates[i].finished) << i;
    EXPECT_EQ(back.report.updates[i].finish_reason, outcome.report.updates[i].finish_reason) << i;
  }
  EXPECT_EQ(back.report.updates[3].error, InternalError("boom"));
  EXPECT_FALSE(back.report.updates[4].finished);
}

TEST(EngineCodecTest, AnUnknownFinishReasonEndsThatRequestWithInvalidArgument) {
  v1::StepResult message;
  v1::EngineUpdate* ok = message.add_updates();
  ok->set_request_id(1);
  ok->set_finished(true);
  ok->set_finish_reason("length");
  v1::EngineUpdate* bad = message.add_updates();
  bad->set_request_id(2);
  bad->set_finished(true);
  bad->set_finish_reason("exploded");

  StepOutcome back = FromProto(message);
  ASSERT_EQ(back.report.updates.size(), 2u);
  EXPECT_EQ(back.report.updates[0].finish_reason, FinishReason::kLength);
  EXPECT_TRUE(back.report.updates[0].error.ok());
  const RequestUpdate& u = back.report.updates[1];
  EXPECT_TRUE(u.finished);
  EXPECT_EQ(u.finish_reason, FinishReason::kError);
  EXPECT_EQ(u.error.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(u.error.message(), HasSubstr("updates[1].finish_reason"));
  EXPECT_THAT(u.error.message(), HasSubstr("'exploded'"));
}

}  // namespace
}  // namespace specula::services
