// SpecDecDrafter on tiny random models: the cache equals a from-scratch recompute under ragged
// observations (and after Propose's temporary slots), chains follow the slot argmax / carry the
// shaped slot distribution, bad observations change nothing, and greedy speculative decoding
// (lossless, and SpecDec's relaxed rule at beta = 1) equals plain greedy decoding.
#include "common/drafters/specdec/specdec_drafter.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <random>

#include "common/drafters/draft_sampling.h"
#include "common/drafters/specdec/specdec_model.h"
#include "common/engine/plain_decoder.h"
#include "common/model/transformer.h"
#include "common/spec/spec_engine.h"
#include "tests/drafters/random_specdec.h"
#include "tests/testing/tiny_model.h"

namespace specula {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kSlots = 4;

SpecDecConfig Config() { return TinySpecDecConfig(TinyModelConfig(), 2, 2, kSlots); }

std::shared_ptr<SpecDecImpl> Module(uint64_t seed = 5) {
  return RandomSpecDecModule(Config(), TinyModelConfig(), seed);
}

std::unique_ptr<SpecDecDrafter> Drafter(uint64_t seed = 5, int64_t blocks = 256) {
  auto d = SpecDecDrafter::Create(Module(seed), {.kv = {.block_size = 4, .num_blocks = blocks}});
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? std::move(*d) : nullptr;
}

std::vector<int32_t> RandomTokens(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % TinyModelConfig().vocab_size);
  return t;
}

// Every cache layer and the slot logits of `seq` in `d` equal those of a fresh drafter that
// observed the same tokens in one call.
void ExpectMatchesRecompute(SpecDecDrafter& d, SeqId seq, const std::string& what) {
  auto tokens = d.Tokens(seq);
  ASSERT_TRUE(tokens.ok());
  auto fresh = Drafter();
  ASSERT_TRUE(fresh->AddSequence(1, {}).ok());
  ASSERT_TRUE(fresh->Observe({{.seq = 1, .tokens = *tokens}}).ok());
  const int64_t layers = Config().encoder_layers + Config().decoder_layers;
  for (int64_t l = 0; l < layers; ++l) {
    auto mine = d.CacheOf(seq, l);
    auto theirs = fresh->CacheOf(1, l);
    ASSERT_TRUE(mine.ok() && theirs.ok());
    ASSERT_EQ(mine->first.size(0), static_cast<int64_t>(tokens->size())) << what;
    EXPECT_TRUE(torch::allclose(mine->first, theirs->first, 1e-4, 1e-4))
        << what << ": layer " << l << " keys";
    EXPECT_TRUE(torch::allclose(mine->second, theirs->second, 1e-4, 1e-4))
        << what << ": layer " << l << " values";
  }
  auto a = d.SlotLogits(seq);
  auto b = fresh->SlotLogits(1);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(torch::allclose(*a, *b, 1e-3, 1e-3)) << what << ": slot logits";
}

TEST(SpecDecDrafterTest, CacheEqualsRecomputeUnderRaggedAcceptance) {
  auto d = Drafter();
  const std::vector<int32_t> tokens = RandomTokens(80, 11);
  const std::vector<SeqId> seqs = {101, 102, 103};
  for (SeqId s : seqs) ASSERT_TRUE(d->AddSequence(s, {}).ok());
  std::vector<int64_t> len = {10, 3, 0};  // seq 103 joins a round later
  {
    std::vector<DrafterObservation> obs;
    for (size_t b = 0; b < 2; ++b) {
      obs.push_back({.seq = seqs[b],
                     .tokens = std::vector<int32_t>(tokens.begin(), tokens.begin() + len[b])});
    }
    ASSERT_TRUE(d->Observe(obs).ok());
  }
  std::mt19937 rng(3);
  for (int round = 0; round < 10; ++round) {
    std::vector<DrafterObservation> obs;
    for (size_t b = 0; b < seqs.size(); ++b) {
      if (round % 3 == 2 && b == 1) continue;  // a sequence that skips a round (deferred)
      const int64_t added = len[b] == 0 ? 7 : 1 + rng() % 5;  // accepted drafts + bonus
      obs.push_back({.seq = seqs[b],
                     .tokens = std::vector<int32_t>(tokens.begin() + len[b],
                                                    tokens.begin() + len[b] + added)});
      len[b] += added;
    }
    ASSERT_TRUE(d->Observe(obs).ok());
    // Propose in between: its temporary slots must leave the cache as it was.
    std::vector<DraftRequest> requests;
    for (SeqId s : seqs) requests.push_back({.seq = s, .max_nodes = 3, .max_depth = 8});
    ASSERT_TRUE(d->Propose(requests).ok());
    for (SeqId s : seqs) ExpectMatchesRecompute(*d, s, "round " + std::to_string(round));
  }
}

TEST(SpecDecDrafterTest, ChainsFollowTheSlotsAndCarryShapedDistributions) {
  auto d = Drafter();
  const SamplingParams sampled{.temperature = 0.8f, .top_k = 10, .seed = 4};
  ASSERT_TRUE(d->AddSequence(1, {}).ok());
  ASSERT_TRUE(d->AddSequence(2, sampled).ok());
  const std::vector<int32_t> prompt = RandomTokens(9, 2);
  ASSERT_TRUE(d->Observe({{.seq = 1, .tokens = prompt}, {.seq = 2, .tokens = prompt}}).ok());
  auto slots = d->SlotLogits(1);
  ASSERT_TRUE(slots.ok());
  ASSERT_EQ(slots->size(0), kSlots);
  auto trees = d->Propose({{.seq = 1, .max_nodes = 3, .max_depth = 8},
                           {.seq = 2, .max_nodes = 8, .max_depth = 2},
                           {.seq = 1, .max_nodes = 0, .max_depth = 8}});
  ASSERT_FALSE(trees.ok()) << "a sequence requested twice";
  trees = d->Propose(
      {{.seq = 1, .max_nodes = 3, .max_depth = 8}, {.seq = 2, .max_nodes = 8, .max_depth = 2}});
  ASSERT_TRUE(trees.ok()) << trees.status();
  const CandidateTree& greedy = (*trees)[0];
  ASSERT_EQ(greedy.size(), 3);  // min(k, max_nodes, max_depth)
  for (int32_t j = 0; j < greedy.size(); ++j) {
    const at::Tensor row = (*slots)[j].contiguous();
    const std::span<const float> r(row.data_ptr<float>(), static_cast<size_t>(row.numel()));
    EXPECT_EQ(greedy.parent(j), j - 1);
    EXPECT_EQ(greedy.token(j), Argmax(r)) << j;
    EXPECT_EQ(greedy.proposal(j), -1);
  }
  const CandidateTree& chain = (*trees)[1];
  ASSERT_EQ(chain.size(), 2);
  for (int32_t j = 0; j < chain.size(); ++j) {
    const at::Tensor row = (*slots)[j].contiguous();
    const std::span<const float> r(row.data_ptr<float>(), static_cast<size_t>(row.numel()));
    const std::vector<float> expected = Probabilities(r, sampled);
    ASSERT_GE(chain.proposal(j), 0);
    const auto q = chain.distribution(chain.proposal(j));
    ASSERT_EQ(q.size(), expected.size());
    for (size_t v = 0; v < q.size(); ++v) EXPECT_NEAR(q[v], expected[v], 1e-5) << j << " " << v;
    EXPECT_GT(expected[chain.token(j)], 0.0f);
  }
}

TEST(SpecDecDrafterTest, BadObservationsChangeNothing) {
  auto d = Drafter(5, /*blocks=*/4);  // 16 positions in all
  ASSERT_TRUE(d->AddSequence(1, {}).ok());
  ASSERT_TRUE(d->Observe({{.seq = 1, .tokens = {1, 2, 3}}}).ok());
  auto expect = [&](const std::vector<DrafterObservation>& obs, StatusCode code,
                    const std::string& text) {
    const Status s = d->Observe(obs);
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_THAT(s.message(), HasSubstr(text));
    EXPECT_EQ(*d->Tokens(1), (std::vector<int32_t>{1, 2, 3}));
    EXPECT_EQ(d->CacheOf(1, 0)->first.size(0), 3);
  };
  expect({{.seq = 7, .tokens = {1}}}, StatusCode::kNotFound, "sequence 7");
  expect({{.seq = 1, .tokens = {4, 64}}}, StatusCode::kInvalidArgument, "tokens[1] = 64");
  expect({{.seq = 1, .tokens = {-1}}}, StatusCode::kInvalidArgument, "outside the vocabulary");
  expect({{.seq = 1, .tokens = {4}}, {.seq = 1, .tokens = {5}}}, StatusCode::kInvalidArgument,
         "observed twice");
  expect({{.seq = 1, .tokens = RandomTokens(20, 1)}}, StatusCode::kResourceExhausted,
         "SpecDec cache");
  EXPECT_EQ(d->Propose({{.seq = 9, .max_nodes = 2, .max_depth = 2}}).status().code(),
            StatusCode::kNotFound);
  // Nothing observed yet: no draft, no error.
  ASSERT_TRUE(d->AddSequence(2, {}).ok());
  auto trees = d->Propose({{.seq = 2, .max_nodes = 4, .max_depth = 4}});
  ASSERT_TRUE(trees.ok());
  EXPECT_EQ((*trees)[0].size(), 0);
  EXPECT_EQ(d->SlotLogits(2).status().code(), StatusCode::kFailedPrecondition);
  // A full cache fails the slots' forward for that call only; the cache is left as it was.
  ASSERT_TRUE(d->Observe({{.seq = 1, .tokens = RandomTokens(12, 3)}}).ok());  // 15 of 16
  EXPECT_EQ(d->Propose({{.seq = 1, .max_nodes = 4, .max_depth = 4}}).status().code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(d->CacheOf(1, 0)->first.size(0), 15);
}

TEST(SpecDecDrafterTest, CreateRejectsBadOptions) {
  auto bad_dtype = SpecDecDrafter::Create(Module(), {.dtype = "float64"});
  ASSERT_FALSE(bad_dtype.ok());
  EXPECT_THAT(bad_dtype.status().message(), HasSubstr("float64"));
  auto bad_name = SpecDecDrafter::Create(Module(), {.name = "none"});
  ASSERT_FALSE(bad_name.ok());
  EXPECT_THAT(bad_name.status().message(), HasSubstr("reserved"));
  auto missing = SpecDecDrafter::Load("/nonexistent/specdec", TinyModelConfig());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

// Greedy speculative decoding through SpecDec equals plain greedy decoding at several budgets,
// batch 1 and a mixed-length batch, with lossless verification and with SpecDec's relaxed rule
// at beta = 1 (which is greedy).
TEST(SpecDecDrafterTest, GreedyAndBetaOneEqualPlainDecoding) {
  auto target_module = MakeTinyModel(TinyModelConfig(), 3, /*weight_scale=*/4.0);
  ModelRunnerOptions o;
  o.kv.block_size = 4;
  o.kv.num_blocks = 512;
  auto target = ModelRunner::FromModule(target_module, o);
  ASSERT_TRUE(target.ok());
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 4; ++i) {
    requests.push_back({.prompt = RandomTokens(3 + 9 * i, 40 + i), .max_new_tokens = 30});
  }
  std::vector<std::vector<int32_t>> plain;
  for (const auto& r : requests) {
    auto out = DecodeBatch(**target, {r});
    ASSERT_TRUE(out.ok());
    plain.push_back((*out)[0].tokens);
  }
  SpecEngine engine(target->get());
  ASSERT_TRUE(engine.AddDrafter(Drafter()).ok());
  int64_t drafted = 0;
  VerifyParams beta_one{.mode = VerifyMode::kSpecDec, .specdec_beta = 1, .specdec_tau = 100.0f};
  for (const VerifyParams& verify : {VerifyParams{}, beta_one}) {
    for (int32_t k : {1, 3, 8}) {
      std::vector<SpecRequest> batch;
      for (const auto& r : requests) {
        batch.push_back(
            {.generation = r,
             .speculation = {.drafter = "specdec", .max_draft_tokens = k, .verify = verify}});
      }
      auto one = GenerateAll(engine, {batch[0]});
      ASSERT_TRUE(one.ok()) << one.status();
      EXPECT_EQ((*one)[0].result.tokens, plain[0]) << "k " << k;
      auto out = GenerateAll(engine, batch);
      ASSERT_TRUE(out.ok()) << out.status();
      for (size_t i = 0; i < requests.size(); ++i) {
        EXPECT_EQ((*out)[i].result.tokens, plain[i]) << "k " << k << " #" << i;
        EXPECT_EQ((*out)[i].stats.draft_errors, 0) << (*out)[i].stats.last_draft_error;
        drafted += (*out)[i].stats.draft_tokens;
      }
    }
  }
  EXPECT_GT(drafted, 0);
  EXPECT_EQ(engine.DrafterStateBytes(), 0) << "finished sequences keep drafter state";
}

}  // namespace
}  // namespace specula
