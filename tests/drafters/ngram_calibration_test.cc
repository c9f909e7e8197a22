#include "common/drafters/ngram_calibration.h"

#include <gtest/gtest.h>

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

TEST(NgramDraftOutcomesTest, EveryProposedTokenIsATrialOnceTheOnesBeforeItMatched) {
  NgramCalibration c;
  NgramDraftOutcomes outcomes;
  outcomes.Proposed(/*at=*/10, {5, 6, 7, 8}, /*cls=*/3);
  outcomes.Committed(10, 5, c);  // position 1: hit
  outcomes.Committed(11, 6, c);  // position 2: hit
  outcomes.Committed(12, 9, c);  // position 3: miss, and the proposal is done
  outcomes.Committed(13, 8, c);  // not a trial: position 3 already failed
  // Each measured position moved from 1/2: up at 1 and 2, down at 3; 4 was never in question.
  EXPECT_GT(c.Conditional(3, 1), 0.5);
  EXPECT_GT(c.Conditional(3, 2), 0.5);
  EXPECT_LT(c.Conditional(3, 3), 0.5);
  EXPECT_DOUBLE_EQ(c.Conditional(3, 4), 0.5);
}

TEST(NgramDraftOutcomesTest, OverlappingProposalsAreEachMeasured) {
  NgramCalibration c;
  NgramDraftOutcomes outcomes;
  outcomes.Proposed(0, {1, 2, 3}, 0);
  outcomes.Committed(0, 1, c);
  outcomes.Proposed(1, {2, 3}, 4);  // made after the first token, while the first still matches
  outcomes.Committed(1, 2, c);
  outcomes.Committed(2, 3, c);
  for (int32_t j = 1; j <= 3; ++j) EXPECT_GT(c.Conditional(0, j), 0.5) << j;
  for (int32_t j = 1; j <= 2; ++j) EXPECT_GT(c.Conditional(4, j), 0.5) << j;
  // A proposal whose tokens never come (the sequence moved past it) is dropped, not counted.
  outcomes.Proposed(3, {9}, 1);
  outcomes.Committed(5, 9, c);
  EXPECT_DOUBLE_EQ(c.Conditional(1, 1), c.Conditional(2, 1)) << "class 1 got a trial";
}

}  // namespace
}  // namespace specula
