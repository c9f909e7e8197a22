#include "common/train/glancing.h"

#include <gtest/gtest.h>

#include <vector>

namespace specula {
namespace {

TEST(GlancingRevealTest, RevealsTheRoundedShareOfWrongSlotsOnly) {
  const std::vector<int64_t> gold = {5, 6, 7, 8, 9, -1, 11, 12};
  const std::vector<int64_t> predicted = {5, 0, 7, 0, 0, 3, 0, 12};  // wrong: slots 1, 3, 4, 6
  for (uint64_t seed = 0; seed < 50; ++seed) {
    std::mt19937_64 rng(seed);
    const std::vector<int64_t> r = GlancingReveal(predicted, gold, 0.5, rng);
    ASSERT_EQ(r.size(), gold.size());
    int revealed = 0;
    for (size_t j = 0; j < r.size(); ++j) {
      if (r[j] < 0) continue;
      ++revealed;
      EXPECT_EQ(r[j], gold[j]) << "a revealed slot shows its gold token";
      EXPECT_NE(predicted[j], gold[j]) << "slot " << j << " was right: never revealed";
    }
    EXPECT_EQ(revealed, 2) << "round(0.5 x 4 wrong)";
  }
}

TEST(GlancingRevealTest, RatioZeroRevealsNothingAndOneRevealsEveryWrongSlot) {
  const std::vector<int64_t> gold = {1, 2, 3, -1};
  const std::vector<int64_t> predicted = {0, 2, 0, 0};
  std::mt19937_64 rng(1);
  EXPECT_EQ(GlancingReveal(predicted, gold, 0.0, rng), (std::vector<int64_t>{-1, -1, -1, -1}));
  EXPECT_EQ(GlancingReveal(predicted, gold, 1.0, rng), (std::vector<int64_t>{1, -1, 3, -1}));
  EXPECT_EQ(GlancingReveal(predicted, gold, 7.0, rng), (std::vector<int64_t>{1, -1, 3, -1}));
  // Everything right: nothing to reveal.
  EXPECT_EQ(GlancingReveal(gold, gold, 1.0, rng), (std::vector<int64_t>{-1, -1, -1, -1}));
}

TEST(GlancingRevealTest, EveryWrongSlotIsChosenSometimes) {
  const std::vector<int64_t> gold = {1, 2, 3, 4};
  const std::vector<int64_t> predicted = {0, 0, 0, 0};
  std::vector<int> count(4, 0);
  std::mt19937_64 rng(3);
  for (int i = 0; i < 400; ++i) {
    const auto r = GlancingReveal(predicted, gold, 0.25, rng);
    for (size_t j = 0; j < r.size(); ++j) count[j] += r[j] >= 0;
  }
  for (int c : count) EXPECT_GT(c, 50);  // ~100 each
}

TEST(GlancingRatioTest, AnnealsLinearlyToZero) {
  EXPECT_DOUBLE_EQ(GlancingRatio(0.5, 0, 101), 0.5);
  EXPECT_DOUBLE_EQ(GlancingRatio(0.5, 50, 101), 0.25);
  EXPECT_DOUBLE_EQ(GlancingRatio(0.5, 100, 101), 0.0);
  EXPECT_DOUBLE_EQ(GlancingRatio(0.0, 10, 101), 0.0);
}

}  // namespace
}  // namespace specula
