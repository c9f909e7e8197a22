// The acceptance tables drafters cut their proposals by (NgramCalibration by match length,
// ConfidenceCalibration by the drafter's probability) and the proposal outcomes that feed them.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>
#include <vector>

#include "common/drafters/confidence_calibration.h"
#include "common/drafters/draft_outcomes.h"
#include "common/drafters/ngram_calibration.h"

namespace specula {
namespace {

TEST(NgramCalibrationTest, ClassesByMatchLength) {
  EXPECT_EQ(NgramCalibration::ClassOf(1), 0);
  EXPECT_EQ(NgramCalibration::ClassOf(2), 1);
  EXPECT_EQ(NgramCalibration::ClassOf(3), 2);
  EXPECT_EQ(NgramCalibration::ClassOf(4), 2);
  EXPECT_EQ(NgramCalibration::ClassOf(5), 3);
  EXPECT_EQ(NgramCalibration::ClassOf(7), 3);
  EXPECT_EQ(NgramCalibration::ClassOf(NgramCalibration::kLongMatch), 4);
  EXPECT_EQ(NgramCalibration::ClassOf(100), 4);
}

TEST(NgramCalibrationTest, UnmeasuredPositionsStartAtOneHalf) {
  NgramCalibration c;
  EXPECT_DOUBLE_EQ(c.Conditional(0, 1), 0.5);
  // Reach 1/2, 1/4, 1/8: two nodes reach 0.2.
  EXPECT_EQ(c.Keep(0, 8, 0.2), 2);
  EXPECT_EQ(c.Keep(0, 8, 0.0), 8);  // no price: every node
  EXPECT_EQ(c.Keep(0, 1, 0.2), 1);  // never more than proposed
  EXPECT_EQ(c.Keep(0, 0, 0.2), 0);
}

TEST(NgramCalibrationTest, EachClassKeepsWhatItsOwnRecordPays) {
  NgramCalibration c;
  for (int i = 0; i < 200; ++i) {
    c.Record(0, 1, i % 10 == 0);  // short matches: the first token 10% of the time
    for (int32_t j = 1; j <= 8; ++j) c.Record(4, j, true);  // long ones: always
  }
  EXPECT_NEAR(c.Conditional(0, 1), 0.1, 0.03);
  EXPECT_GT(c.Conditional(4, 8), 0.95);
  EXPECT_EQ(c.Keep(0, 8, 0.2), 0);
  EXPECT_EQ(c.Keep(4, 8, 0.2), 8);
  // A class with no record of its own starts from every class's average at that position.
  EXPECT_NEAR(c.Conditional(2, 1), (20 + 200 + 0.5) / (400 + 1.0), 1e-9);
}

TEST(NgramCalibrationTest, FollowsTheRecentRecord) {
  NgramCalibration c;
  for (int i = 0; i < 5000; ++i) c.Record(1, 1, false);
  for (int i = 0; i < 3000; ++i) c.Record(1, 1, true);
  EXPECT_GT(c.Conditional(1, 1), 0.9) << "old misses still weigh";
}

DraftOutcomes::Record Into(NgramCalibration& c) {
  return [&c](int32_t cls, int32_t j, bool accepted) { c.Record(cls, j, accepted); };
}

TEST(DraftOutcomesTest, EveryProposedTokenIsATrialOnceTheOnesBeforeItMatched) {
  NgramCalibration c;
  DraftOutcomes outcomes;
  outcomes.Proposed(/*at=*/10, {5, 6, 7, 8}, /*classes=*/{3});
  outcomes.Committed(10, 5, Into(c));  // position 1: hit
  outcomes.Committed(11, 6, Into(c));  // position 2: hit
  outcomes.Committed(12, 9, Into(c));  // position 3: miss, and the proposal is done
  outcomes.Committed(13, 8, Into(c));  // not a trial: position 3 already failed
  // Each measured position moved from 1/2: up at 1 and 2, down at 3; 4 was never in question.
  EXPECT_GT(c.Conditional(3, 1), 0.5);
  EXPECT_GT(c.Conditional(3, 2), 0.5);
  EXPECT_LT(c.Conditional(3, 3), 0.5);
  EXPECT_DOUBLE_EQ(c.Conditional(3, 4), 0.5);
}

TEST(DraftOutcomesTest, OverlappingProposalsAreEachMeasured) {
  NgramCalibration c;
  DraftOutcomes outcomes;
  outcomes.Proposed(0, {1, 2, 3}, {0});
  outcomes.Committed(0, 1, Into(c));
  outcomes.Proposed(1, {2, 3}, {4});  // made after the first token, while the first still matches
  outcomes.Committed(1, 2, Into(c));
  outcomes.Committed(2, 3, Into(c));
  for (int32_t j = 1; j <= 3; ++j) EXPECT_GT(c.Conditional(0, j), 0.5) << j;
  for (int32_t j = 1; j <= 2; ++j) EXPECT_GT(c.Conditional(4, j), 0.5) << j;
  // A proposal whose tokens never come (the sequence moved past it) is dropped, not counted.
  outcomes.Proposed(3, {9}, {1});
  outcomes.Committed(5, 9, Into(c));
  EXPECT_DOUBLE_EQ(c.Conditional(1, 1), c.Conditional(2, 1)) << "class 1 got a trial";
}

TEST(DraftOutcomesTest, EachNodeIsRecordedUnderItsOwnClass) {
  std::vector<std::tuple<int32_t, int32_t, bool>> trials;
  const DraftOutcomes::Record record = [&](int32_t cls, int32_t j, bool accepted) {
    trials.emplace_back(cls, j, accepted);
  };
  DraftOutcomes outcomes;
  outcomes.Proposed(4, {7, 8, 9}, {11, 2, 5});
  outcomes.Committed(4, 7, record);
  outcomes.Committed(5, 8, record);
  outcomes.Committed(6, 1, record);
  outcomes.Committed(7, 9, record);  // the proposal ended at its miss
  const std::vector<std::tuple<int32_t, int32_t, bool>> want = {
      {11, 1, true}, {2, 2, true}, {5, 3, false}};
  EXPECT_EQ(trials, want);
  // A retried step's proposal replaces the first; a short class list repeats its last class.
  trials.clear();
  outcomes.Proposed(10, {1, 2}, {3});
  outcomes.Proposed(10, {1, 4}, {6});
  outcomes.Committed(10, 1, record);
  outcomes.Committed(11, 4, record);
  const std::vector<std::tuple<int32_t, int32_t, bool>> retried = {{6, 1, true}, {6, 2, true}};
  EXPECT_EQ(trials, retried);
}

TEST(ConfidenceCalibrationTest, BinsByTheDraftersProbability) {
  EXPECT_EQ(ConfidenceCalibration::BinOf(0), 0);
  EXPECT_EQ(ConfidenceCalibration::BinOf(-1), 0);
  EXPECT_EQ(ConfidenceCalibration::BinOf(std::nan("")), 0);
  EXPECT_EQ(ConfidenceCalibration::BinOf(0.05), 0);
  EXPECT_EQ(ConfidenceCalibration::BinOf(0.1), 1);
  EXPECT_EQ(ConfidenceCalibration::BinOf(0.55), 5);
  EXPECT_EQ(ConfidenceCalibration::BinOf(0.93), 9);
  EXPECT_EQ(ConfidenceCalibration::BinOf(0.97), 10);
  EXPECT_EQ(ConfidenceCalibration::BinOf(0.995), ConfidenceCalibration::kBins - 1);
  EXPECT_EQ(ConfidenceCalibration::BinOf(1), ConfidenceCalibration::kBins - 1);
  EXPECT_EQ(ConfidenceCalibration::BinOf(2), ConfidenceCalibration::kBins - 1);
}

TEST(ConfidenceCalibrationTest, StartsAtTheDraftersProbabilityAndMovesToWhatWasMeasured) {
  ConfidenceCalibration c;
  // Unmeasured: each bin's middle; non-decreasing across bins.
  EXPECT_DOUBLE_EQ(c.Conditional(ConfidenceCalibration::BinOf(0.55)), 0.55);
  EXPECT_DOUBLE_EQ(c.Conditional(0), 0.05);
  for (int32_t b = 1; b < ConfidenceCalibration::kBins; ++b) {
    EXPECT_GT(c.Conditional(b), c.Conditional(b - 1)) << b;
  }
  EXPECT_DOUBLE_EQ(c.Average(), 0.5);
  // An overconfident bin: 0.55 drafted, 1 in 4 kept.
  const int32_t bin = ConfidenceCalibration::BinOf(0.55);
  for (int i = 0; i < 400; ++i) c.Record(bin, i % 4 == 0);
  EXPECT_NEAR(c.Conditional(bin), 0.25, 0.01);
  EXPECT_NEAR(c.Average(), 0.25, 0.01);
  EXPECT_DOUBLE_EQ(c.Conditional(bin + 1), 0.65) << "other bins keep their prior";
  // Out-of-range bins are ignored, and read as the nearest bin.
  c.Record(-1, true);
  c.Record(ConfidenceCalibration::kBins, true);
  EXPECT_NEAR(c.Average(), 0.25, 0.01);
  EXPECT_DOUBLE_EQ(c.Conditional(100), c.Conditional(ConfidenceCalibration::kBins - 1));
}

TEST(ConfidenceCalibrationTest, FollowsTheRecentRecord) {
  ConfidenceCalibration c;
  for (int i = 0; i < 5000; ++i) c.Record(3, false);
  for (int i = 0; i < 3000; ++i) c.Record(3, true);
  EXPECT_GT(c.Conditional(3), 0.9) << "old misses still weigh";
}

}  // namespace
}  // namespace specula
