// What the hidden-state drafters' bitwise tests of their CPU forwards (SpecFormerCpuForward,
// CpuForward's layer and head) against their modules share: a draft vocabulary, a non-zero bias,
// the two sequences, and observation rounds that take the forward through each of its paths (a
// catch-up of 50 rows over two sequences, more than kSmallMatmulMaxRows: the module's path; two
// batched steady rounds; a single row), and the comparison of an output of the two.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/drafters/draft_vocab.h"
#include "common/spec/drafter.h"

namespace specula {

// Every `step`-th token of [0, vocab) from `first`.
inline std::shared_ptr<DraftVocab> EveryNthToken(int32_t vocab, int32_t step, int32_t first) {
  auto v = std::make_shared<DraftVocab>();
  v->vocab_size = vocab;
  for (int32_t t = first; t < vocab; t += step) v->tokens.push_back(t);
  return v;
}

// A bias the init leaves at 0, set to the same random values in every call.
inline void RandomBias(torch::Tensor& bias) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(21);
  bias.normal_(0.0, 0.5);
}

// Sequences 1 and 2, which CpuForwardRounds observes.
inline bool AddRoundSequences(Drafter& drafter) {
  return drafter.AddSequence(1, {}).ok() && drafter.AddSequence(2, {}).ok();
}

// Sequences 1 and 2; `hidden_layers` random [rows, d] states per observation (0: token-only),
// tokens in [0, vocab).
inline std::vector<std::vector<DrafterObservation>> CpuForwardRounds(size_t hidden_layers,
                                                                     int64_t d, int32_t vocab) {
  torch::manual_seed(11);
  std::mt19937 rng(7);
  auto observation = [&](SeqId seq, int64_t tokens, int64_t rows) {
    DrafterObservation o{.seq = seq};
    for (int64_t i = 0; i < tokens; ++i) o.tokens.push_back(static_cast<int32_t>(rng() % vocab));
    for (size_t k = 0; k < hidden_layers; ++k) o.hidden.push_back(torch::randn({rows, d}));
    return o;
  };
  return {{observation(1, 12, 11), observation(2, 40, 39)},
          {observation(1, 3, 3), observation(2, 2, 2)},
          {observation(2, 4, 4), observation(1, 1, 1)},
          {observation(1, 1, 1)}};
}

// Bitwise equality of a tensor, or of a cache's keys and values.
inline bool BitwiseEqual(const at::Tensor& a, const at::Tensor& b) { return torch::equal(a, b); }
inline bool BitwiseEqual(const std::pair<at::Tensor, at::Tensor>& a,
                         const std::pair<at::Tensor, at::Tensor>& b) {
  return torch::equal(a.first, b.first) && torch::equal(a.second, b.second);
}

// `of(drafter)` (a StatusOr of either) for the drafter on its CPU forward and the one on its
// module: both OK and bitwise the same.
template <typename D, typename Of>
void ExpectBitwiseSame(D& fast, D& reference, const Of& of, const std::string& what) {
  auto a = of(fast);
  auto b = of(reference);
  ASSERT_TRUE(a.ok() && b.ok()) << what;
  EXPECT_TRUE(BitwiseEqual(*a, *b)) << what;
}

// Both drafters observe each round; after each, check(seq, where) for sequences 1 and 2.
template <typename D, typename Check>
void ObserveRoundsAndCheck(D& fast, D& reference,
                           const std::vector<std::vector<DrafterObservation>>& rounds,
                           const Check& check) {
  for (size_t r = 0; r < rounds.size(); ++r) {
    ASSERT_TRUE(fast.Observe(rounds[r]).ok()) << "round " << r;
    ASSERT_TRUE(reference.Observe(rounds[r]).ok()) << "round " << r;
    for (SeqId seq : {1, 2})
      check(seq, "round " + std::to_string(r) + " sequence " + std::to_string(seq));
  }
}

}  // namespace specula
