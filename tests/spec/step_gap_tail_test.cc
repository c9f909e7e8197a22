#include "common/spec/step_gap_tail.h"

#include <gtest/gtest.h>

namespace specula {
namespace {

// Undrafted steps of 1 ms for `n` gaps each, every `every`-th `slow` instead.
void AddSteps(StepGapTail& tail, int steps, int every, double slow, int32_t gaps = 1) {
  for (int i = 0; i < steps; ++i) {
    const double wall = i % every == every - 1 ? slow : 1e-3;
    tail.Add(wall, 1e-3, 1e-3, gaps);
  }
}

TEST(StepGapTailTest, NotReadyUntilEnoughStepsWithGaps) {
  StepGapTail tail;
  AddSteps(tail, StepGapTail::kReadyAfter - 1, 10, 5e-3);
  // A step nobody waited for (a prompt's own first token at batch 1) is no gap.
  AddSteps(tail, 100, 1, 50e-3, /*gaps=*/0);
  EXPECT_FALSE(tail.ready());
  EXPECT_EQ(tail.plain_quantile(), 0);
  AddSteps(tail, 1, 10, 5e-3);
  EXPECT_TRUE(tail.ready());
}

TEST(StepGapTailTest, TheP99OfTheGapsWeighsEachStepByItsSequences) {
  StepGapTail tail;
  // One step in 50 is 5 ms: 2% of the gaps, so the p99 is 5 ms and the residual's 4 ms.
  AddSteps(tail, 1000, 50, 5e-3);
  EXPECT_DOUBLE_EQ(tail.plain_quantile(), 5e-3);
  EXPECT_NEAR(tail.residual_quantile(), 4e-3, 1e-12);
  // One in 200 (0.5% of the steps): the p99 is the common step...
  StepGapTail rare;
  AddSteps(rare, 1000, 200, 5e-3);
  EXPECT_DOUBLE_EQ(rare.plain_quantile(), 1e-3);
  // ...unless the slow steps are those many sequences waited for: 0.5% of the steps with 4 gaps
  // each against 1 for the others are 2% of the gaps.
  StepGapTail weighted;
  for (int i = 0; i < 1000; ++i) {
    const bool slow = i % 200 == 199;
    weighted.Add(slow ? 5e-3 : 1e-3, 1e-3, 1e-3, slow ? 4 : 1);
  }
  EXPECT_DOUBLE_EQ(weighted.plain_quantile(), 5e-3);
}

TEST(StepGapTailTest, ADraftedStepCountsAsItsGapWithoutItsDrafts) {
  StepGapTail tail;
  // Every step drafts, planned at 1.5 ms where it would take 1 ms without its drafts, and runs as
  // planned or, one in 50, 3 ms longer: without drafts the streams' p99 gap would be 4 ms.
  for (int i = 0; i < 1000; ++i) tail.Add(i % 50 == 49 ? 4.5e-3 : 1.5e-3, 1.5e-3, 1e-3, 2);
  EXPECT_NEAR(tail.plain_quantile(), 4e-3, 1e-12);
  EXPECT_NEAR(tail.residual_quantile(), 3e-3, 1e-12);
}

TEST(StepGapTailTest, AcceptedTokensCountAsThePlainStepsTheyStandFor) {
  // Without drafts: 1 ms decode steps and, 0.8% of them, 5 ms steps that also prefill a prompt:
  // the p99 gap is the decode step.
  StepGapTail plain;
  for (int i = 0; i < 1000; ++i) {
    const bool prompt = i % 125 == 124;
    plain.Add(prompt ? 5e-3 : 1e-3, prompt ? 5e-3 : 1e-3, prompt ? 5e-3 : 1e-3, 1, 0, prompt);
  }
  ASSERT_DOUBLE_EQ(plain.plain_quantile(), 1e-3);
  // The same tokens with drafts that each decode step accepts one of (planned at 1.5 ms, 1 ms
  // without its drafts): half the decode steps, so the prompt steps are 1.6% of the steps; the
  // accepted tokens stand for the decode steps they saved, and the p99 stays the decode step's.
  StepGapTail drafted;
  for (int i = 0; i < 1000; ++i) {
    const bool prompt = i % 63 == 62;
    if (prompt) {
      drafted.Add(5e-3, 5e-3, 5e-3, 1, 0, /*prompt_chunks=*/true);
    } else {
      drafted.Add(1.5e-3, 1.5e-3, 1e-3, 1, /*accepted=*/1);
    }
  }
  EXPECT_DOUBLE_EQ(drafted.plain_quantile(), 1e-3);
  // Counted as steps alone, the drafts would lift their own reference to the prompt steps.
  StepGapTail steps_only;
  for (int i = 0; i < 1000; ++i) {
    const bool prompt = i % 63 == 62;
    steps_only.Add(prompt ? 5e-3 : 1.5e-3, prompt ? 5e-3 : 1.5e-3, prompt ? 5e-3 : 1e-3, 1);
  }
  EXPECT_DOUBLE_EQ(steps_only.plain_quantile(), 5e-3);
  // A prompt step's own accepted tokens stand for decode steps, not for prompt steps.
  StepGapTail mixed;
  for (int i = 0; i < 1000; ++i) {
    const bool prompt = i % 63 == 62;
    mixed.Add(prompt ? 5.5e-3 : 1.5e-3, prompt ? 5.5e-3 : 1.5e-3, prompt ? 5e-3 : 1e-3, 1,
              /*accepted=*/1, prompt);
  }
  EXPECT_DOUBLE_EQ(mixed.plain_quantile(), 1e-3);
}

TEST(StepGapTailTest, ForgetsStepsOutsideItsWindow) {
  StepGapTail tail;
  AddSteps(tail, 1000, 20, 10e-3);  // a noisy stretch
  ASSERT_DOUBLE_EQ(tail.plain_quantile(), 10e-3);
  AddSteps(tail, StepGapTail::kWindow, 1000000, 0);  // then a quiet one, a window long
  EXPECT_DOUBLE_EQ(tail.plain_quantile(), 1e-3);
  EXPECT_NEAR(tail.residual_quantile(), 0, 1e-12);
}

}  // namespace
}  // namespace specula
