#include "common/drafters/draft_model_drafter.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "common/drafters/confidence_calibration.h"
#include "common/engine/plain_decoder.h"
#include "common/model/transformer.h"
#include "tests/testing/tiny_model.h"

namespace specula {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr int32_t kVocab = 64;

// One position per block by default, so that the used blocks count the cached positions.
ModelRunnerOptions Options(int64_t num_blocks = 256, int64_t block_size = 1) {
  ModelRunnerOptions o;
  o.kv.block_size = block_size;
  o.kv.num_blocks = num_blocks;
  return o;
}

// Positions the drafter's runner holds, over all its sequences (with one-position blocks).
int64_t CachedPositions(const DraftModelDrafter& d) {
  const KvCacheStats stats = d.model().kv_stats();
  EXPECT_EQ(stats.block_size, 1);
  return stats.num_blocks - stats.free_blocks;
}

// Larger weights give sharp logits without near ties, so chunked and token-by-token forwards agree
// on every argmax.
std::shared_ptr<CausalLMImpl> Model(uint64_t seed = 3, ModelConfig config = TinyModelConfig()) {
  return MakeTinyModel(config, seed, /*weight_scale=*/4.0);
}

std::unique_ptr<ModelRunner> Runner(std::shared_ptr<CausalLMImpl> module,
                                    const ModelRunnerOptions& options = Options()) {
  auto runner = ModelRunner::FromModule(std::move(module), options);
  EXPECT_TRUE(runner.ok()) << runner.status();
  return runner.ok() ? std::move(*runner) : nullptr;
}

std::unique_ptr<DraftModelDrafter> Drafter(std::shared_ptr<CausalLMImpl> module,
                                           int32_t tree_width = 1,
                                           const ModelRunnerOptions& options = Options()) {
  auto d = DraftModelDrafter::Create(Runner(std::move(module), options), kVocab,
                                     {.tree_width = tree_width});
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? std::move(*d) : nullptr;
}

std::vector<int32_t> RandomTokens(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % kVocab);
  return t;
}

// Plain greedy decoding of `n` tokens after `history` (the reference every chain must equal).
std::vector<int32_t> GreedyReference(std::shared_ptr<CausalLMImpl> module,
                                     const std::vector<int32_t>& history, int64_t n) {
  auto runner = Runner(std::move(module));
  auto results = DecodeBatch(*runner, {{.prompt = history, .max_new_tokens = n}});
  EXPECT_TRUE(results.ok()) << results.status();
  return results.ok() ? (*results)[0].tokens : std::vector<int32_t>{};
}

// Logits after the last token of `tokens`, from a fresh runner.
std::vector<float> ReferenceLogits(std::shared_ptr<CausalLMImpl> module,
                                   const std::vector<int32_t>& tokens) {
  auto runner = Runner(std::move(module));
  EXPECT_TRUE(runner->AddSequence(1).ok());
  auto out = runner->Forward({.seqs = {{.seq = 1, .tokens = tokens}}});
  EXPECT_TRUE(out.ok()) << out.status();
  if (!out.ok()) return {};
  at::Tensor row = out->logits[0].contiguous();
  return std::vector<float>(row.data_ptr<float>(), row.data_ptr<float>() + row.numel());
}

std::vector<double> SoftmaxRef(const std::vector<float>& logits) {
  const double m = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double total = 0;
  for (size_t i = 0; i < p.size(); ++i) total += p[i] = std::exp(logits[i] - m);
  for (auto& x : p) x /= total;
  return p;
}

std::vector<int32_t> TopRef(const std::vector<float>& logits, size_t w) {
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  order.resize(w);
  return order;
}

CandidateTree ProposeOne(DraftModelDrafter& d, SeqId seq, int32_t max_nodes, int32_t max_depth) {
  auto trees = d.Propose({{.seq = seq, .max_nodes = max_nodes, .max_depth = max_depth}});
  EXPECT_TRUE(trees.ok()) << trees.status();
  if (!trees.ok()) return {};
  EXPECT_EQ(trees->size(), 1u);
  Status valid = trees->front().Validate(kVocab, max_nodes, max_depth);
  EXPECT_TRUE(valid.ok()) << valid;
  return std::move(trees->front());
}

void ExpectChain(const CandidateTree& t) {
  for (int32_t i = 0; i < t.size(); ++i) EXPECT_EQ(t.parent(i), i - 1) << i;
}

TEST(DraftModelDrafterTest, GreedyChainEqualsPlainDecoding) {
  auto module = Model();
  for (size_t length : {1, 6, 23}) {
    auto d = Drafter(module);
    const std::vector<int32_t> history = RandomTokens(length, 100 + length);
    ASSERT_TRUE(d->AddSequence(5, {}).ok());
    ASSERT_TRUE(d->Observe({{.seq = 5, .tokens = history}}).ok());
    const CandidateTree t = ProposeOne(*d, 5, 8, 6);
    ExpectChain(t);
    ASSERT_EQ(t.size(), 6);
    EXPECT_THAT(t.tokens(), ElementsAreArray(GreedyReference(module, history, 6)));
    EXPECT_EQ(t.num_distributions(), 0);
    // draft_prob is the softmax probability of the argmax.
    std::vector<int32_t> path = history;
    for (int32_t i = 0; i < t.size(); ++i) {
      EXPECT_EQ(t.proposal(i), -1);
      const auto p = SoftmaxRef(ReferenceLogits(module, path));
      EXPECT_NEAR(t.draft_prob(i), p[t.token(i)], 1e-5) << i;
      path.push_back(t.token(i));
    }
    // The drafted tokens but the last stay cached for the next step.
    EXPECT_EQ(CachedPositions(*d), static_cast<int64_t>(length) + 5);
  }
}

TEST(DraftModelDrafterTest, ReconcilesTheCacheWithWhatWasAccepted) {
  auto module = Model();
  auto d = Drafter(module);
  std::mt19937 rng(17);
  std::vector<int32_t> history = RandomTokens(9, 1);
  ASSERT_TRUE(d->AddSequence(2, {}).ok());
  ASSERT_TRUE(d->Observe({{.seq = 2, .tokens = history}}).ok());
  for (int step = 0; step < 10; ++step) {
    const int32_t depth = 5;
    const CandidateTree t = ProposeOne(*d, 2, depth, depth);
    ASSERT_THAT(t.tokens(), ElementsAreArray(GreedyReference(module, history, depth)))
        << "step " << step;
    // Accept a prefix; the bonus token sometimes agrees with the next draft (so the whole history
    // is cached already), sometimes not (so the cache must be cut back). Every fourth step the
    // appended tokens have nothing to do with the draft (as after a step drafted by someone else).
    const int32_t accepted = static_cast<int32_t>(rng() % (depth + 1));
    std::vector<int32_t> appended(t.tokens().begin(), t.tokens().begin() + accepted);
    if (step % 4 == 3) {
      appended = {t.token(0), (t.token(1) + 1) % kVocab, t.token(2), t.token(3)};
    } else if (accepted < depth && step % 3 == 0) {
      appended.push_back(t.token(accepted));
    } else {
      appended.push_back(static_cast<int32_t>(rng() % kVocab));
    }
    ASSERT_TRUE(d->Observe({{.seq = 2, .tokens = appended}}).ok());
    history.insert(history.end(), appended.begin(), appended.end());
  }
}

TEST(DraftModelDrafterTest, BatchedProposalsEqualOneAtATime) {
  auto module = Model();
  for (int32_t width : {1, 3}) {
    auto batched = Drafter(module, width);
    std::vector<std::unique_ptr<DraftModelDrafter>> single;
    const std::vector<std::vector<int32_t>> prompts = {RandomTokens(3, 7), RandomTokens(11, 8),
                                                       RandomTokens(17, 9)};
    const std::vector<DraftRequest> requests = {{.seq = 10, .max_nodes = 4, .max_depth = 4},
                                                {.seq = 20, .max_nodes = 7, .max_depth = 3},
                                                {.seq = 30, .max_nodes = 2, .max_depth = 6}};
    for (size_t i = 0; i < prompts.size(); ++i) {
      single.push_back(Drafter(module, width));
      ASSERT_TRUE(batched->AddSequence(requests[i].seq, {}).ok());
      ASSERT_TRUE(single[i]->AddSequence(requests[i].seq, {}).ok());
      ASSERT_TRUE(batched->Observe({{.seq = requests[i].seq, .tokens = prompts[i]}}).ok());
      ASSERT_TRUE(single[i]->Observe({{.seq = requests[i].seq, .tokens = prompts[i]}}).ok());
    }
    for (int round = 0; round < 3; ++round) {
      auto trees = batched->Propose(requests);
      ASSERT_TRUE(trees.ok()) << trees.status();
      ASSERT_EQ(trees->size(), 3u);
      for (size_t i = 0; i < prompts.size(); ++i) {
        const CandidateTree& got = (*trees)[i];
        const DraftRequest& r = requests[i];
        ASSERT_TRUE(got.Validate(kVocab, r.max_nodes, r.max_depth).ok());
        const CandidateTree want = ProposeOne(*single[i], r.seq, r.max_nodes, r.max_depth);
        ASSERT_EQ(got.tokens(), want.tokens()) << "width " << width << " round " << round;
        ASSERT_EQ(got.parents(), want.parents());
        for (int32_t n = 0; n < got.size(); ++n) {
          EXPECT_NEAR(got.draft_prob(n), want.draft_prob(n), 1e-5);
        }
        // Accept the first node when there is one, plus a bonus token.
        std::vector<int32_t> appended;
        if (!got.empty()) appended.push_back(got.token(0));
        appended.push_back(static_cast<int32_t>((round * 7 + i * 13) % kVocab));
        ASSERT_TRUE(batched->Observe({{.seq = r.seq, .tokens = appended}}).ok());
        ASSERT_TRUE(single[i]->Observe({{.seq = r.seq, .tokens = appended}}).ok());
      }
    }
  }
}

// Checks a greedy or sampled tree against reference forwards of each node's path.
void CheckTree(const std::shared_ptr<CausalLMImpl>& module, const std::vector<int32_t>& history,
               const CandidateTree& t, int32_t width, const SamplingParams& sampling) {
  for (int32_t node = -1; node < t.size(); ++node) {
    const std::vector<int32_t> children = t.Children(node);
    if (children.empty()) continue;
    std::vector<int32_t> path = history;
    for (int32_t a : t.PathTo(node)) path.push_back(t.token(a));
    const std::vector<float> logits = ReferenceLogits(module, path);
    const std::vector<int32_t> top = TopRef(logits, width);
    std::vector<float> probs;
    if (sampling.greedy()) {
      for (double p : SoftmaxRef(logits)) probs.push_back(static_cast<float>(p));
    } else {
      probs = Probabilities(logits, sampling);
    }
    // The children are the best of the top-w tokens, best first.
    ASSERT_LE(children.size(), top.size());
    for (size_t c = 0; c < children.size(); ++c) {
      EXPECT_EQ(t.token(children[c]), top[c]) << "node " << node << " child " << c;
      EXPECT_NEAR(t.draft_prob(children[c]), probs[top[c]], 1e-5);
      EXPECT_EQ(t.proposal(children[c]), -1);
    }
  }
}

TEST(DraftModelDrafterTest, TreeHoldsTheTopChildrenOfEachExpandedNode) {
  auto module = Model();
  const int32_t width = 3;
  struct Budget {
    int32_t max_nodes, max_depth;
  };
  for (Budget b : {Budget{12, 4}, Budget{20, 3}, Budget{5, 5}, Budget{30, 2}, Budget{2, 6}}) {
    auto d = Drafter(module, width);
    const std::vector<int32_t> history = RandomTokens(10, 40);
    ASSERT_TRUE(d->AddSequence(1, {}).ok());
    ASSERT_TRUE(d->Observe({{.seq = 1, .tokens = history}}).ok());
    const CandidateTree t = ProposeOne(*d, 1, b.max_nodes, b.max_depth);
    // Levels of at most w and w * w nodes, filled until the budget runs out.
    int32_t capacity = 0;
    for (int32_t depth = 1, level = width; depth <= b.max_depth; ++depth, level = width * width) {
      capacity += level;
    }
    EXPECT_EQ(t.size(), std::min(b.max_nodes, capacity));
    EXPECT_LE(t.max_depth(), b.max_depth);
    for (int32_t i = 0; i < t.size(); ++i) EXPECT_LT(t.parent(i), i);
    EXPECT_EQ(t.Children(-1).size(), std::min<size_t>(width, b.max_nodes));
    CheckTree(module, history, t, width, {});

    // The first child of each node along the top path is the greedy chain.
    std::vector<int32_t> top_path;
    for (int32_t node = -1;;) {
      auto children = t.Children(node);
      if (children.empty()) break;
      node = children[0];
      top_path.push_back(t.token(node));
    }
    ASSERT_FALSE(top_path.empty());
    const auto greedy = GreedyReference(module, history, b.max_depth);
    EXPECT_THAT(top_path, ElementsAreArray(greedy.begin(), greedy.begin() + top_path.size()));

    // Tree nodes are never left in the draft cache.
    EXPECT_EQ(CachedPositions(*d), static_cast<int64_t>(history.size()));
  }
}

TEST(DraftModelDrafterTest, TreeAfterObserveAndForSampledRequests) {
  auto module = Model();
  const SamplingParams sampling{.temperature = 1.5f, .top_k = 10, .seed = 4};
  auto d = Drafter(module, 2);
  std::vector<int32_t> history = RandomTokens(7, 50);
  ASSERT_TRUE(d->AddSequence(1, sampling).ok());
  ASSERT_TRUE(d->Observe({{.seq = 1, .tokens = history}}).ok());
  for (int step = 0; step < 3; ++step) {
    const CandidateTree t = ProposeOne(*d, 1, 9, 4);
    ASSERT_EQ(t.size(), 9);
    EXPECT_EQ(t.num_distributions(), 0);  // trees are deterministic candidate sets
    CheckTree(module, history, t, 2, sampling);
    // Accept the path to the last node plus a bonus token.
    std::vector<int32_t> appended;
    for (int32_t a : t.PathTo(t.size() - 1)) appended.push_back(t.token(a));
    appended.push_back(static_cast<int32_t>(step * 5 % kVocab));
    ASSERT_TRUE(d->Observe({{.seq = 1, .tokens = appended}}).ok());
    history.insert(history.end(), appended.begin(), appended.end());
  }
}

TEST(DraftModelDrafterTest, SampledChainAttachesTheShapedDistribution) {
  auto module = Model();
  for (const SamplingParams& sampling :
       {SamplingParams{.temperature = 1.0f, .seed = 1},
        SamplingParams{.temperature = 2.0f, .top_k = 8, .seed = 2},
        SamplingParams{.temperature = 0.7f, .top_p = 0.9f, .seed = 3}}) {
    auto d = Drafter(module);
    const std::vector<int32_t> history = RandomTokens(12, 60);
    ASSERT_TRUE(d->AddSequence(1, sampling).ok());
    ASSERT_TRUE(d->Observe({{.seq = 1, .tokens = history}}).ok());
    const CandidateTree t = ProposeOne(*d, 1, 6, 6);
    ASSERT_EQ(t.size(), 6);
    ExpectChain(t);
    std::vector<int32_t> path = history;
    for (int32_t i = 0; i < t.size(); ++i) {
      const int32_t j = t.proposal(i);
      ASSERT_GE(j, 0);
      const std::span<const float> q = t.distribution(j);
      const std::vector<float> want = Probabilities(ReferenceLogits(module, path), sampling);
      ASSERT_EQ(q.size(), want.size());
      for (size_t v = 0; v < q.size(); ++v) EXPECT_NEAR(q[v], want[v], 1e-5) << i << " " << v;
      EXPECT_EQ(Argmax(q), Argmax(want));
      EXPECT_GT(q[t.token(i)], 0.0f);
      EXPECT_EQ(t.draft_prob(i), q[t.token(i)]);
      path.push_back(t.token(i));
    }

    // The same seed drafts the same chain.
    auto again = Drafter(module);
    ASSERT_TRUE(again->AddSequence(1, sampling).ok());
    ASSERT_TRUE(again->Observe({{.seq = 1, .tokens = history}}).ok());
    EXPECT_EQ(ProposeOne(*again, 1, 6, 6).tokens(), t.tokens());
  }
}

TEST(DraftModelDrafterTest, SampledTokensFollowTheAttachedDistribution) {
  auto module = Model();
  const SamplingParams base{.temperature = 2.0f, .top_k = 6};
  const std::vector<int32_t> history = RandomTokens(8, 90);
  const std::vector<float> q = Probabilities(ReferenceLogits(module, history), base);
  ASSERT_LT(*std::max_element(q.begin(), q.end()), 0.9f);  // a real choice to make
  // One batched proposal for many sequences that differ only in their seed.
  constexpr int kSeqs = 2000;
  auto d = Drafter(module, 1, Options(/*num_blocks=*/kSeqs * 8));
  std::vector<DraftRequest> requests;
  for (int s = 0; s < kSeqs; ++s) {
    SamplingParams sampling = base;
    sampling.seed = static_cast<uint64_t>(s);
    ASSERT_TRUE(d->AddSequence(s, sampling).ok());
    ASSERT_TRUE(d->Observe({{.seq = s, .tokens = history}}).ok());
    requests.push_back({.seq = s, .max_nodes = 1, .max_depth = 1});
  }
  auto trees = d->Propose(requests);
  ASSERT_TRUE(trees.ok()) << trees.status();
  std::vector<double> freq(kVocab, 0.0);
  for (const CandidateTree& t : *trees) {
    ASSERT_EQ(t.size(), 1);
    freq[t.token(0)] += 1.0 / kSeqs;
  }
  double total_variation = 0;
  for (int v = 0; v < kVocab; ++v) {
    total_variation += std::abs(freq[v] - q[v]) / 2;
    if (q[v] == 0.0f) {
      EXPECT_EQ(freq[v], 0.0) << v;
    }
  }
  EXPECT_LT(total_variation, 0.05);
}

// Near its position limit a draft LM drafts what still fits; a history longer than the limit
// starts over from its last limit / 2 tokens (a draft LM with a shorter context than the target's
// still drafts for long sequences).
TEST(DraftModelDrafterTest, StaysWithinTheDraftModelsContext) {
  ModelConfig config = TinyModelConfig();
  config.max_position_embeddings = 24;
  auto module = Model(5, config);
  for (int32_t width : {1, 2}) {
    auto d = Drafter(module, width);
    const std::vector<int32_t> near_end = RandomTokens(width == 1 ? 20 : 22, 70);
    const std::vector<int32_t> too_long = RandomTokens(25, 71);
    const std::vector<int32_t> fine = RandomTokens(5, 72);
    ASSERT_TRUE(d->AddSequence(1, {}).ok());
    ASSERT_TRUE(d->AddSequence(2, {}).ok());
    ASSERT_TRUE(d->AddSequence(3, {}).ok());
    ASSERT_TRUE(d->Observe({{.seq = 1, .tokens = near_end},
                            {.seq = 2, .tokens = too_long},
                            {.seq = 3, .tokens = fine}})
                    .ok());
    auto trees = d->Propose({{.seq = 1, .max_nodes = 10, .max_depth = 10},
                             {.seq = 2, .max_nodes = 10, .max_depth = 10},
                             {.seq = 3, .max_nodes = 4, .max_depth = 4}});
    ASSERT_TRUE(trees.ok()) << trees.status();
    const CandidateTree& t = (*trees)[0];
    ASSERT_TRUE(t.Validate(kVocab, 10, 10).ok());
    const std::vector<int32_t> recent(too_long.end() - 12, too_long.end());
    const CandidateTree& restarted = (*trees)[1];
    ASSERT_TRUE(restarted.Validate(kVocab, 10, 10).ok());
    if (width == 1) {
      EXPECT_THAT(restarted.tokens(), ElementsAreArray(GreedyReference(module, recent, 10)));
    } else {
      EXPECT_EQ(restarted.size(), 10);
      CheckTree(module, recent, restarted, width, {});
    }
    EXPECT_EQ((*trees)[2].size(), 4);
    if (width == 1) {
      // 20 cached tokens + 4 drafted ones fill the context; the 5th comes from the last position.
      ASSERT_EQ(t.size(), 5);
      const auto greedy = GreedyReference(module, near_end, 4);
      EXPECT_THAT(std::vector<int32_t>(t.tokens().begin(), t.tokens().begin() + 4),
                  ElementsAreArray(greedy));
      std::vector<int32_t> path = near_end;
      path.insert(path.end(), greedy.begin(), greedy.end());
      EXPECT_EQ(t.token(4), Argmax(ReferenceLogits(module, path)));
    } else {
      // 22 cached tokens: the second level runs 2 tree nodes, the third would need at least 3.
      EXPECT_EQ(t.size(), 6);
      EXPECT_EQ(t.max_depth(), 2);
      CheckTree(module, near_end, t, width, {});
    }
  }
}

// With a context of W tokens, a sequence further behind than W (a new prompt, or one left
// undrafted for a while) is drafted as if its history were its last W tokens, and the runner
// holds only those; a sequence drafted step after step keeps its start and reads what follows.
TEST(DraftModelDrafterTest, AContextWindowStartsFromTheRecentTokens) {
  auto module = Model(11);
  auto made = DraftModelDrafter::Create(Runner(module), kVocab, {.context = 8});
  ASSERT_TRUE(made.ok()) << made.status();
  DraftModelDrafter& d = **made;
  std::vector<int32_t> history = RandomTokens(30, 90);
  ASSERT_TRUE(d.AddSequence(1, {}).ok());
  ASSERT_TRUE(d.Observe({{.seq = 1, .tokens = history}}).ok());
  auto last = [&](size_t n) { return std::vector<int32_t>(history.end() - n, history.end()); };
  CandidateTree t = ProposeOne(d, 1, 4, 4);
  EXPECT_THAT(t.tokens(), ElementsAreArray(GreedyReference(module, last(8), 4)));
  EXPECT_EQ(CachedPositions(d), 8 + 3);  // the window, then the chain's first three nodes

  // Two drafted tokens accepted and the target's own: the next chain reads the same start on.
  const std::vector<int32_t> committed = {t.token(0), t.token(1), static_cast<int32_t>(5)};
  ASSERT_TRUE(d.Observe({{.seq = 1, .tokens = committed}}).ok());
  history.insert(history.end(), committed.begin(), committed.end());
  EXPECT_THAT(ProposeOne(d, 1, 4, 4).tokens(),
              ElementsAreArray(GreedyReference(module, last(11), 4)));
  EXPECT_EQ(CachedPositions(d), 11 + 3);

  // Twenty tokens without a draft: further behind than the window, so it starts over.
  const std::vector<int32_t> more = RandomTokens(20, 91);
  ASSERT_TRUE(d.Observe({{.seq = 1, .tokens = more}}).ok());
  history.insert(history.end(), more.begin(), more.end());
  EXPECT_THAT(ProposeOne(d, 1, 4, 4).tokens(),
              ElementsAreArray(GreedyReference(module, last(8), 4)));
  EXPECT_EQ(CachedPositions(d), 8 + 3);

  // A history shorter than the window is read whole.
  ASSERT_TRUE(d.AddSequence(2, {}).ok());
  const std::vector<int32_t> shortest = RandomTokens(5, 92);
  ASSERT_TRUE(d.Observe({{.seq = 2, .tokens = shortest}}).ok());
  EXPECT_THAT(ProposeOne(d, 2, 3, 3).tokens(),
              ElementsAreArray(GreedyReference(module, shortest, 3)));
}

// A chain's reach is the product of its nodes' calibrated acceptance (at first, the middle of
// each node's confidence bin): it ends before the first node below min_reach, and no forward runs
// for a depth whose expected reach is below depth_reach.
TEST(DraftModelDrafterTest, ChainsStopWhereTheirReachNoLongerPays) {
  auto module = Model();
  const std::vector<int32_t> history = RandomTokens(12, 70);
  for (const SamplingParams& sampling :
       {SamplingParams{}, SamplingParams{.temperature = 1.0f, .seed = 4}}) {
    auto propose = [&](double min_reach, double depth_reach) {
      auto d = Drafter(module);
      EXPECT_TRUE(d->AddSequence(1, sampling).ok());
      EXPECT_TRUE(d->Observe({{.seq = 1, .tokens = history}}).ok());
      auto trees = d->Propose({{.seq = 1,
                                .max_nodes = 6,
                                .max_depth = 6,
                                .min_reach = min_reach,
                                .depth_reach = depth_reach}});
      EXPECT_TRUE(trees.ok()) << trees.status();
      if (!trees.ok()) return std::make_pair(CandidateTree(), int64_t{0});
      Status valid = trees->front().Validate(kVocab, 6, 6);
      EXPECT_TRUE(valid.ok()) << valid;
      return std::make_pair(std::move(trees->front()), CachedPositions(*d));
    };
    const auto [full, full_cached] = propose(0, 0);
    ASSERT_EQ(full.size(), 6);
    std::vector<double> reach;
    double r = 1;
    const ConfidenceCalibration fresh;
    for (int32_t i = 0; i < full.size(); ++i) {
      reach.push_back(r *= fresh.Conditional(ConfidenceCalibration::BinOf(full.draft_prob(i))));
    }
    ASSERT_GT(reach[2], reach[3]);
    // Cut after three nodes: the rest of the chain (and its distributions) left out.
    const auto [cut, cut_cached] = propose((reach[2] + reach[3]) / 2, 0);
    ASSERT_EQ(cut.size(), 3);
    for (int32_t i = 0; i < 3; ++i) {
      EXPECT_EQ(cut.token(i), full.token(i)) << i;
      EXPECT_EQ(cut.draft_prob(i), full.draft_prob(i)) << i;
    }
    EXPECT_EQ(cut.num_distributions(), sampling.greedy() ? 0 : 3);
    // The fourth depth was not expected to reach far enough (the third node's reach times an
    // average node's, 1/2 before anything is measured): its forward did not run.
    EXPECT_EQ(cut_cached, static_cast<int64_t>(history.size()) + 2);
    // A depth that cannot pay for its forward: only the catch-up's node, no drafting forward.
    const auto [shallow, shallow_cached] = propose(0, 1e9);
    ASSERT_EQ(shallow.size(), 1);
    EXPECT_EQ(shallow.token(0), full.token(0));
    EXPECT_EQ(shallow_cached, static_cast<int64_t>(history.size()));
    EXPECT_EQ(full_cached, static_cast<int64_t>(history.size()) + 5);
  }
}

// The calibration follows what the target kept: drafts that are always rejected stop being
// proposed under a row price, drafts that are always accepted keep being proposed.
TEST(DraftModelDrafterTest, TheCalibrationLearnsFromTheCommittedTokens) {
  auto module = Model();
  for (bool accept : {false, true}) {
    auto d = Drafter(module);
    std::vector<int32_t> history = RandomTokens(10, 71);
    ASSERT_TRUE(d->AddSequence(1, {}).ok());
    ASSERT_TRUE(d->Observe({{.seq = 1, .tokens = history}}).ok());
    constexpr int kSteps = 90, kWindow = 20;
    int32_t early = 0, late = 0;  // nodes proposed in the first and the last kWindow steps
    for (int step = 0; step < kSteps; ++step) {
      auto trees = d->Propose({{.seq = 1, .max_nodes = 3, .max_depth = 3, .min_reach = 0.05}});
      ASSERT_TRUE(trees.ok()) << trees.status();
      const CandidateTree& t = trees->front();
      if (step < kWindow) early += t.size();
      if (step >= kSteps - kWindow) late += t.size();
      // The next token: the first draft when accepting, anything else when rejecting (the first
      // node is drafted even when the chain is cut before it, so the rejection is measured).
      const int32_t drafted = t.empty() ? GreedyReference(module, history, 1)[0] : t.token(0);
      const int32_t token = accept ? drafted : (drafted + 1) % kVocab;
      ASSERT_TRUE(d->Observe({{.seq = 1, .tokens = {token}}}).ok());
      history.push_back(token);
    }
    if (accept) {
      EXPECT_EQ(late, 3 * kWindow);
      EXPECT_GT(late, early);
    } else {
      EXPECT_GT(early, kWindow);
      EXPECT_LT(late, early / 3) << "rejected drafts are still proposed";
    }
  }
}

TEST(DraftModelDrafterTest, FullCacheFailsWithoutCorruptingSequences) {
  auto module = Model();
  // 8 blocks of 4 positions: two 12-token histories fit, their drafts do not.
  auto d = Drafter(module, 1, Options(/*num_blocks=*/8, /*block_size=*/4));
  const std::vector<int32_t> a = RandomTokens(12, 80), b = RandomTokens(12, 81);
  ASSERT_TRUE(d->AddSequence(1, {}).ok());
  ASSERT_TRUE(d->AddSequence(2, {}).ok());
  ASSERT_TRUE(d->Observe({{.seq = 1, .tokens = a}, {.seq = 2, .tokens = b}}).ok());
  auto trees = d->Propose(
      {{.seq = 1, .max_nodes = 8, .max_depth = 8}, {.seq = 2, .max_nodes = 8, .max_depth = 8}});
  ASSERT_FALSE(trees.ok());
  EXPECT_EQ(trees.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(trees.status().message(), HasSubstr("draft model"));
  // With the other sequence gone, sequence 1 drafts exactly what plain decoding says.
  d->ReleaseSequence(2);
  EXPECT_THAT(ProposeOne(*d, 1, 8, 8).tokens(), ElementsAreArray(GreedyReference(module, a, 8)));
}

// With a draft vocabulary the chain is greedy over the kept tokens only (the head reads only
// their rows), each token's probability is the softmax over them, and sampled proposals put no
// mass outside them; a vocabulary for another model size is refused naming it.
TEST(DraftModelDrafterTest, DraftVocabularyDraftsOnlyItsTokens) {
  auto module = Model();
  auto vocab = std::make_shared<DraftVocab>();
  vocab->vocab_size = kVocab;
  for (int32_t t = 0; t < kVocab; t += 3) vocab->tokens.push_back(t);
  auto created = DraftModelDrafter::Create(Runner(module), kVocab, {.draft_vocab = vocab});
  ASSERT_TRUE(created.ok()) << created.status();
  DraftModelDrafter& d = **created;
  const std::vector<int32_t> history = RandomTokens(11, 7);
  ASSERT_TRUE(d.AddSequence(1, {}).ok());
  ASSERT_TRUE(d.Observe({{.seq = 1, .tokens = history}}).ok());
  const CandidateTree t = ProposeOne(d, 1, 5, 5);
  ASSERT_EQ(t.size(), 5);
  std::vector<int32_t> path = history;
  bool differs_from_full_head = false;
  for (int32_t i = 0; i < t.size(); ++i) {
    std::vector<float> logits = ReferenceLogits(module, path);
    differs_from_full_head |= TopRef(logits, 1)[0] != t.token(i);
    for (int32_t v = 0; v < kVocab; ++v) {
      if (v % 3 != 0) logits[v] = -std::numeric_limits<float>::infinity();
    }
    const std::vector<double> p = SoftmaxRef(logits);
    EXPECT_EQ(t.token(i), TopRef(logits, 1)[0]) << i;
    EXPECT_NEAR(t.draft_prob(i), p[t.token(i)], 1e-5) << i;
    path.push_back(t.token(i));
  }
  // The test means something only if the full head would have drafted something else.
  EXPECT_TRUE(differs_from_full_head);

  ASSERT_TRUE(d.AddSequence(2, {.temperature = 1.0f, .seed = 5}).ok());
  ASSERT_TRUE(d.Observe({{.seq = 2, .tokens = history}}).ok());
  for (int round = 0; round < 4; ++round) {
    const CandidateTree s = ProposeOne(d, 2, 4, 4);
    ASSERT_EQ(s.num_distributions(), s.size());
    for (int32_t i = 0; i < s.size(); ++i) {
      EXPECT_EQ(s.token(i) % 3, 0) << i;
      const auto dist = s.distribution(s.proposal(i));
      for (int32_t v = 0; v < kVocab; ++v) {
        if (v % 3 != 0) {
          EXPECT_EQ(dist[v], 0.0f) << v;
        }
      }
    }
    ASSERT_TRUE(d.Observe({{.seq = 2, .tokens = {s.token(0)}}}).ok());
  }

  auto other = std::make_shared<DraftVocab>(*vocab);
  other->vocab_size = 4096;
  auto refused = DraftModelDrafter::Create(Runner(module), kVocab, {.draft_vocab = other});
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("draft vocabulary"));
}

TEST(DraftModelDrafterTest, Errors) {
  auto module = Model();
  ModelConfig wide = TinyModelConfig();
  wide.vocab_size = 65;
  auto mismatch = DraftModelDrafter::Create(Runner(Model(3, wide)), kVocab);
  EXPECT_EQ(mismatch.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(mismatch.status().message(), AllOf(HasSubstr("65"), HasSubstr("64")));
  EXPECT_EQ(DraftModelDrafter::Create(Runner(module), kVocab, {.tree_width = 0}).status().code(),
            StatusCode::kInvalidArgument);
  const Status negative =
      DraftModelDrafter::Create(Runner(module), kVocab, {.context = -1}).status();
  EXPECT_EQ(negative.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(negative.message(), HasSubstr("context"));
  EXPECT_EQ(DraftModelDrafter::Create(nullptr, kVocab).status().code(),
            StatusCode::kInvalidArgument);

  auto d = Drafter(module);
  EXPECT_EQ(d->name(), "draft-model");
  EXPECT_THAT(d->hidden_layers(), IsEmpty());
  ASSERT_TRUE(d->AddSequence(1, {}).ok());
  EXPECT_EQ(d->AddSequence(1, {}).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(d->AddSequence(2, {.temperature = -1.0f}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d->Observe({{.seq = 3, .tokens = {1}}}).code(), StatusCode::kNotFound);
  Status bad_token = d->Observe({{.seq = 1, .tokens = {1, 2, kVocab}}});
  EXPECT_EQ(bad_token.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_token.message(), HasSubstr("vocabulary"));

  // Nothing observed yet (the failed Observe changed nothing): an empty tree.
  EXPECT_TRUE(ProposeOne(*d, 1, 4, 4).empty());
  ASSERT_TRUE(d->Observe({{.seq = 1, .tokens = {1, 2, 3}}}).ok());
  EXPECT_TRUE(ProposeOne(*d, 1, 0, 4).empty());
  EXPECT_TRUE(ProposeOne(*d, 1, 4, 0).empty());
  EXPECT_EQ(d->Propose({{.seq = 9, .max_nodes = 1, .max_depth = 1}}).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(d->Propose({{.seq = 1, .max_nodes = 1, .max_depth = 1},
                        {.seq = 1, .max_nodes = 1, .max_depth = 1}})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_THAT(ProposeOne(*d, 1, 3, 3).tokens(),
              ElementsAreArray(GreedyReference(module, {1, 2, 3}, 3)));

  // Releasing frees the draft cache; the id can be reused.
  d->ReleaseSequence(1);
  EXPECT_EQ(d->model().kv_stats().num_sequences, 0);
  EXPECT_EQ(CachedPositions(*d), 0);
  ASSERT_TRUE(d->AddSequence(1, {}).ok());
  EXPECT_TRUE(ProposeOne(*d, 1, 4, 4).empty());
}

}  // namespace
}  // namespace specula
