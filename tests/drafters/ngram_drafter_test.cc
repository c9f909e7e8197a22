#include "common/drafters/ngram_drafter.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

namespace specula {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::unique_ptr<NgramDrafter> Make(int32_t min_ngram, int32_t max_ngram,
                                   int32_t repeat_min_match = 0) {
  auto d = NgramDrafter::Create(
      {.min_ngram = min_ngram, .max_ngram = max_ngram, .repeat_min_match = repeat_min_match});
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? std::move(*d) : nullptr;
}

// Proposes for one sequence and checks the tree is a valid deterministic chain.
std::vector<int32_t> ProposeChain(NgramDrafter& d, SeqId seq, int32_t max_nodes,
                                  int32_t max_depth) {
  auto trees = d.Propose({{.seq = seq, .max_nodes = max_nodes, .max_depth = max_depth}});
  EXPECT_TRUE(trees.ok()) << trees.status();
  if (!trees.ok()) return {};
  EXPECT_EQ(trees->size(), 1u);
  const CandidateTree& t = trees->front();
  EXPECT_TRUE(t.Validate(/*vocab_size=*/1 << 20, std::max(max_nodes, 0), max_depth).ok());
  for (int32_t i = 0; i < t.size(); ++i) {
    EXPECT_EQ(t.parent(i), i - 1);
    EXPECT_EQ(t.proposal(i), -1);
    EXPECT_EQ(t.draft_prob(i), 1.0f);
  }
  return t.tokens();
}

// Without repeats unless asked: most expectations below are about the match itself.
std::vector<int32_t> Draft(const std::vector<int32_t>& history, int32_t min_ngram,
                           int32_t max_ngram, int32_t max_nodes = 16, int32_t max_depth = 16,
                           int32_t repeat_min_match = 0) {
  auto d = Make(min_ngram, max_ngram, repeat_min_match);
  EXPECT_TRUE(d->AddSequence(1, {}).ok());
  EXPECT_TRUE(d->Observe({{.seq = 1, .tokens = history}}).ok());
  return ProposeChain(*d, 1, max_nodes, max_depth);
}

// The specification, by brute force: for n = max..min, the latest start s < H - n with
// h[s, s + n) == h[H - n, H); propose h[s + n, min(s + n + len, H)), or len tokens of h[s + n, H)
// repeated when the match extended backwards (h[s - m, s + n) == h[H - n - m, H)) is at least
// repeat_min_match > 0 long.
std::vector<int32_t> Reference(const std::vector<int32_t>& h, int32_t min_ngram, int32_t max_ngram,
                               int32_t len, int32_t repeat_min_match) {
  const int64_t H = static_cast<int64_t>(h.size());
  if (len <= 0) return {};
  for (int32_t n = max_ngram; n >= min_ngram; --n) {
    if (n >= H) continue;
    for (int64_t s = H - n - 1; s >= 0; --s) {
      if (std::equal(h.begin() + s, h.begin() + s + n, h.end() - n)) {
        const int64_t from = s + n;
        int64_t match = n;
        while (s - (match - n) - 1 >= 0 && h[s - (match - n) - 1] == h[H - match - 1]) ++match;
        const bool repeat = repeat_min_match > 0 && match >= repeat_min_match;
        std::vector<int32_t> chain(h.begin() + from, h.end());
        while (repeat && static_cast<int64_t>(chain.size()) < len) {
          chain.insert(chain.end(), h.begin() + from, h.end());
        }
        chain.resize(std::min<size_t>(chain.size(), len));
        return chain;
      }
    }
  }
  return {};
}

TEST(NgramDrafterTest, ProposesWhatFollowedTheMatch) {
  EXPECT_THAT(Draft({1, 2, 3, 4, 9, 1, 2, 3}, 1, 3), ElementsAre(4, 9, 1, 2, 3));
  EXPECT_THAT(Draft({7, 8, 9, 7}, 1, 4), ElementsAre(8, 9, 7));
}

TEST(NgramDrafterTest, RepeatsASpanThatRunsUpToTheLastTokenBehindALongMatch) {
  // "1 2 3" matched at 0..2 (3 tokens): what followed (4 9 1 2 3) reaches the end, so it repeats.
  const std::vector<int32_t> loop = {1, 2, 3, 4, 9, 1, 2, 3};
  EXPECT_THAT(Draft(loop, 1, 3, 8, 8, /*repeat_min_match=*/3), ElementsAre(4, 9, 1, 2, 3, 4, 9, 1));
  // The match behind it counts backwards past max_ngram: "2 3" (n = 2) is 3 tokens long there.
  EXPECT_THAT(Draft(loop, 1, 2, 8, 8, 3), ElementsAre(4, 9, 1, 2, 3, 4, 9, 1));
  // A shorter match than asked for: cut at the last token.
  EXPECT_THAT(Draft(loop, 1, 3, 8, 8, 4), ElementsAre(4, 9, 1, 2, 3));
  EXPECT_THAT(Draft({3, 3, 3, 3}, 1, 2, 5, 5, 3), ElementsAre(3, 3, 3, 3, 3));
  EXPECT_THAT(Draft({5, 3, 3}, 1, 2, 5, 5, 2), ElementsAre(3));  // "3" once before: 1 token
  EXPECT_THAT(Draft({7, 8, 9, 7, 8, 9, 7}, 1, 4, 5, 3, 4), ElementsAre(8, 9, 7));  // depth bound
  // Within the budget, what followed the match is the draft, repeats or not.
  EXPECT_THAT(Draft({1, 2, 3, 4, 5, 6, 7, 8, 1}, 1, 3, 8, 8, 1),
              ElementsAre(2, 3, 4, 5, 6, 7, 8, 1));
  EXPECT_THAT(Draft({5, 1, 2, 7, 3, 2, 8, 1, 2}, 1, 2, 3, 3, 1), ElementsAre(7, 3, 2));
}

// DraftRequest::min_reach: the drafter measures how its drafts fare by match length (what the
// sequence went on to be) and leaves out the nodes below the price.
TEST(NgramDrafterTest, LeavesOutNodesBelowTheReachAskedFor) {
  auto d = Make(1, 4, /*repeat_min_match=*/8);
  ASSERT_TRUE(d->AddSequence(1, {}).ok());  // a loop: long matches, always right
  ASSERT_TRUE(d->AddSequence(2, {}).ok());  // random tokens: short matches, rarely right
  std::mt19937 rng(5);
  std::vector<int32_t> loop, noise;
  auto next_loop = [&] { return static_cast<int32_t>(loop.size() % 5); };
  auto next_noise = [&] { return static_cast<int32_t>(rng() % 20); };
  std::vector<int32_t> a, b;
  for (int i = 0; i < 20; ++i) {
    a.push_back(next_loop());
    loop.push_back(a.back());
    b.push_back(next_noise());
    noise.push_back(b.back());
  }
  for (int step = 0; step < 300; ++step) {
    ASSERT_TRUE(d->Observe({{.seq = 1, .tokens = a}, {.seq = 2, .tokens = b}}).ok());
    ASSERT_TRUE(d->Propose({{.seq = 1, .max_nodes = 8, .max_depth = 8},
                            {.seq = 2, .max_nodes = 8, .max_depth = 8}})
                    .ok());
    a = {next_loop()};  // one token a step, as if nothing were accepted
    loop.push_back(a.back());
    b = {next_noise()};
    noise.push_back(b.back());
  }
  ASSERT_TRUE(d->Observe({{.seq = 1, .tokens = a}, {.seq = 2, .tokens = b}}).ok());
  auto priced = d->Propose({{.seq = 1, .max_nodes = 8, .max_depth = 8, .min_reach = 0.3},
                            {.seq = 2, .max_nodes = 8, .max_depth = 8, .min_reach = 0.3}});
  ASSERT_TRUE(priced.ok()) << priced.status();
  EXPECT_EQ((*priced)[0].size(), 8);
  EXPECT_EQ((*priced)[1].size(), 0);
  // Without a price the same requests get every node the match gives.
  auto all = d->Propose(
      {{.seq = 1, .max_nodes = 8, .max_depth = 8}, {.seq = 2, .max_nodes = 8, .max_depth = 8}});
  ASSERT_TRUE(all.ok());
  EXPECT_EQ((*all)[0].tokens(), (*priced)[0].tokens());
  EXPECT_GT((*all)[1].size(), 0);
  EXPECT_THAT((*all)[1].tokens(), ElementsAreArray(Reference(noise, 1, 4, 8, 8)));
}

TEST(NgramDrafterTest, UsesTheMostRecentEarlierOccurrence) {
  EXPECT_THAT(Draft({1, 2, 5, 6, 1, 2, 8, 9, 1, 2}, 2, 2), ElementsAre(8, 9, 1, 2));
  // The suffix itself overlaps its previous occurrence.
  EXPECT_THAT(Draft({3, 3, 3}, 1, 2), ElementsAre(3));
  EXPECT_THAT(Draft({3, 3, 3, 3, 3}, 2, 2), ElementsAre(3));
}

TEST(NgramDrafterTest, PrefersLongerNgrams) {
  // "1 2" last occurred at 1..2 (followed by 7); the 1-gram "2" occurred more recently at 5.
  const std::vector<int32_t> h = {5, 1, 2, 7, 3, 2, 8, 1, 2};
  EXPECT_THAT(Draft(h, 1, 2, 3, 3), ElementsAre(7, 3, 2));
  EXPECT_THAT(Draft(h, 1, 1, 3, 3), ElementsAre(8, 1, 2));
  // Falls back to shorter n-grams when the longer ones do not match.
  EXPECT_THAT(Draft({4, 2, 6, 9, 2}, 1, 4), ElementsAre(6, 9, 2));
}

TEST(NgramDrafterTest, RespectsTheBudget) {
  const std::vector<int32_t> h = {1, 2, 3, 4, 5, 6, 7, 8, 1};
  EXPECT_THAT(Draft(h, 1, 3, 3, 8), ElementsAre(2, 3, 4));
  EXPECT_THAT(Draft(h, 1, 3, 8, 2), ElementsAre(2, 3));
  EXPECT_THAT(Draft(h, 1, 3, 0, 8), IsEmpty());
  EXPECT_THAT(Draft(h, 1, 3, 8, 0), IsEmpty());
  EXPECT_THAT(Draft(h, 1, 3, -1, 8), IsEmpty());
}

TEST(NgramDrafterTest, EmptyWithoutAMatch) {
  EXPECT_THAT(Draft({1, 2, 3, 4}, 1, 4), IsEmpty());
  EXPECT_THAT(Draft({1, 2, 1, 3}, 2, 4), IsEmpty());  // only a 1-gram matches
  EXPECT_THAT(Draft({5}, 1, 1), IsEmpty());
  EXPECT_THAT(Draft({}, 1, 4), IsEmpty());
}

TEST(NgramDrafterTest, MatchesBruteForceOnRandomSequences) {
  std::mt19937 rng(7);
  struct Shape {
    int32_t min_ngram, max_ngram, alphabet;
  };
  for (Shape shape : {Shape{1, 4, 3}, Shape{2, 5, 2}, Shape{1, 1, 5}, Shape{3, 8, 2},
                      Shape{1, 3, 40}, Shape{4, 4, 4}}) {
    for (int trial = 0; trial < 8; ++trial) {
      const int32_t repeat_min_match = trial % 4;  // 0 = never
      auto d = Make(shape.min_ngram, shape.max_ngram, repeat_min_match);
      ASSERT_TRUE(d->AddSequence(3, {}).ok());
      std::vector<int32_t> h;
      std::uniform_int_distribution<int32_t> token(0, shape.alphabet - 1);
      while (h.size() < 600) {
        // Observe in chunks like the engine does (prompt, then accepted tokens + bonus).
        std::vector<int32_t> chunk(1 + rng() % 5);
        for (auto& t : chunk) t = token(rng);
        h.insert(h.end(), chunk.begin(), chunk.end());
        ASSERT_TRUE(d->Observe({{.seq = 3, .tokens = chunk}}).ok());
        const int32_t nodes = 1 + rng() % 8, depth = 1 + rng() % 8;
        ASSERT_EQ(ProposeChain(*d, 3, nodes, depth),
                  Reference(h, shape.min_ngram, shape.max_ngram, std::min(nodes, depth),
                            repeat_min_match))
            << "min " << shape.min_ngram << " max " << shape.max_ngram << " length " << h.size()
            << " repeat_min_match " << repeat_min_match;
      }
    }
  }
}

TEST(NgramDrafterTest, IncrementalObserveEqualsObservingAtOnce) {
  std::mt19937 rng(11);
  std::vector<int32_t> h(500);
  for (auto& t : h) t = static_cast<int32_t>(rng() % 6);
  auto incremental = Make(1, 5);
  ASSERT_TRUE(incremental->AddSequence(1, {}).ok());
  size_t at = 0;
  while (at < h.size()) {
    const size_t n = std::min<size_t>(h.size() - at, 1 + rng() % 7);
    ASSERT_TRUE(
        incremental->Observe({{.seq = 1, .tokens = {h.begin() + at, h.begin() + at + n}}}).ok());
    at += n;
    const std::vector<int32_t> prefix(h.begin(), h.begin() + at);
    ASSERT_EQ(ProposeChain(*incremental, 1, 6, 6), Draft(prefix, 1, 5, 6, 6)) << at;
  }
}

TEST(NgramDrafterTest, SequencesAreIndependentAndBatched) {
  auto d = Make(1, 3);
  ASSERT_TRUE(d->AddSequence(1, {}).ok());
  ASSERT_TRUE(d->AddSequence(2, {}).ok());
  ASSERT_TRUE(d->AddSequence(3, {}).ok());
  ASSERT_TRUE(d->Observe({{.seq = 1, .tokens = {1, 2, 3, 1}}, {.seq = 2, .tokens = {4, 5}}}).ok());
  ASSERT_TRUE(d->Observe({{.seq = 2, .tokens = {6, 4}}}).ok());
  // One sequence twice in one call is refused, as by every drafter.
  EXPECT_EQ(d->Observe({{.seq = 3, .tokens = {1}}, {.seq = 3, .tokens = {2}}}).code(),
            StatusCode::kInvalidArgument);
  auto trees = d->Propose({{.seq = 2, .max_nodes = 4, .max_depth = 4},
                           {.seq = 3, .max_nodes = 4, .max_depth = 4},
                           {.seq = 1, .max_nodes = 1, .max_depth = 4}});
  ASSERT_TRUE(trees.ok()) << trees.status();
  ASSERT_EQ(trees->size(), 3u);
  EXPECT_THAT((*trees)[0].tokens(), ElementsAre(5, 6, 4));
  EXPECT_TRUE((*trees)[1].empty());
  EXPECT_THAT((*trees)[2].tokens(), ElementsAre(2));

  // Released sequences are forgotten; the id can be reused.
  d->ReleaseSequence(1);
  ASSERT_TRUE(d->AddSequence(1, {}).ok());
  EXPECT_THAT(ProposeChain(*d, 1, 4, 4), IsEmpty());
}

TEST(NgramDrafterTest, Errors) {
  auto d = Make(1, 4);
  ASSERT_TRUE(d->AddSequence(1, {}).ok());
  EXPECT_EQ(d->AddSequence(1, {}).code(), StatusCode::kAlreadyExists);

  Status s = d->Observe({{.seq = 1, .tokens = {1, 2}}, {.seq = 9, .tokens = {3}}});
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("9"));
  // The failed call changed nothing: sequence 1 is still empty.
  ASSERT_TRUE(d->Observe({{.seq = 1, .tokens = {5, 5}}}).ok());
  EXPECT_THAT(ProposeChain(*d, 1, 4, 4), ElementsAre(5));

  auto trees = d->Propose(
      {{.seq = 1, .max_nodes = 2, .max_depth = 2}, {.seq = 8, .max_nodes = 2, .max_depth = 2}});
  EXPECT_EQ(trees.status().code(), StatusCode::kNotFound);

  // With the target's vocabulary set, tokens outside it are refused (and change nothing).
  auto checked = NgramDrafter::Create({.min_ngram = 1, .max_ngram = 4, .vocab_size = 8});
  ASSERT_TRUE(checked.ok());
  ASSERT_TRUE((*checked)->AddSequence(1, {}).ok());
  s = (*checked)->Observe({{.seq = 1, .tokens = {5, 8}}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tokens[1] = 8"));
  EXPECT_TRUE(ProposeChain(**checked, 1, 4, 4).empty());
}

TEST(NgramDrafterTest, CreateValidatesOptions) {
  EXPECT_TRUE(NgramDrafter::Create({.min_ngram = 1, .max_ngram = 1}).ok());
  EXPECT_TRUE(NgramDrafter::Create({.min_ngram = 2, .max_ngram = NgramDrafter::kMaxNgram}).ok());
  auto zero = NgramDrafter::Create({.min_ngram = 0, .max_ngram = 3});
  EXPECT_EQ(zero.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(zero.status().message(), HasSubstr("min_ngram"));
  auto inverted = NgramDrafter::Create({.min_ngram = 3, .max_ngram = 2});
  EXPECT_EQ(inverted.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(inverted.status().message(), HasSubstr("max_ngram"));
  auto huge = NgramDrafter::Create({.min_ngram = 1, .max_ngram = NgramDrafter::kMaxNgram + 1});
  EXPECT_EQ(huge.status().code(), StatusCode::kInvalidArgument);
  auto repeat = NgramDrafter::Create({.repeat_min_match = -1});
  EXPECT_EQ(repeat.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(repeat.status().message(), HasSubstr("repeat_min_match"));

  // The constructor does not validate: invalid options give a drafter that never proposes.
  NgramDrafter bad({.min_ngram = 0, .max_ngram = 2});
  ASSERT_TRUE(bad.AddSequence(1, {}).ok());
  ASSERT_TRUE(bad.Observe({{.seq = 1, .tokens = {1, 1, 1, 1}}}).ok());
  EXPECT_THAT(ProposeChain(bad, 1, 4, 4), IsEmpty());
  EXPECT_EQ(NgramDrafter().name(), "ngram");
  EXPECT_THAT(NgramDrafter().hidden_layers(), IsEmpty());
}

}  // namespace
}  // namespace specula
