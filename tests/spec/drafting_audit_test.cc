#include "common/spec/drafting_audit.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <utility>

namespace specula {
namespace {

// A synthetic engine under the audit: every step is a sample with a 1 ms yardstick. A step the
// audit lets draft takes `drafted(step)` seconds and yields `tokens` tokens; one it does not
// takes `undrafted(step, steps since the last drafting step)` seconds for one token; both times
// `speed(step)` (the machine) and 5% noise.
struct Engine {
  double drafted_seconds = 1e-3;
  double drafted_tokens = 1;
  std::function<double(int64_t since_draft)> undrafted = [](int64_t) { return 1e-3; };
  std::function<double(int64_t step)> speed = [](int64_t) { return 1.0; };
  double noise = 0.05;
  double yardstick = 1e-3;  // the step without drafts by the cost fit (norm_seconds)
};

struct Tally {
  int64_t drafting_steps = 0;
  int64_t steps = 0;
  double share() const { return steps > 0 ? static_cast<double>(drafting_steps) / steps : 0; }
};

// Runs `steps` steps from `first` on; the drafting share is counted from `count_from` on.
Tally RunSteps(DraftingAudit& audit, const Engine& e, int64_t first, int64_t steps,
               int64_t count_from = 0, uint32_t seed = 7) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> noise(1.0, e.noise);
  Tally t;
  int64_t since_draft = 1 << 20;
  for (int64_t step = first; step < first + steps; ++step) {
    const bool drafting = audit.drafting();
    const double base = drafting ? e.drafted_seconds : e.undrafted(since_draft);
    const double seconds = base * e.speed(step) * std::max(noise(rng), 0.5);
    audit.Observe(seconds, drafting ? e.drafted_tokens : 1.0, 1, e.yardstick);
    since_draft = drafting ? 0 : since_draft + 1;
    if (step >= count_from) {
      ++t.steps;
      if (drafting) ++t.drafting_steps;
    }
  }
  return t;
}

TEST(DraftingAuditTest, StopsDraftingThatLosesAndTriesItNowAndThen) {
  DraftingAudit audit;
  // Drafted steps take 1.2 ms for 1.08 tokens: 0.9 of no speculation's tokens per second.
  const Engine e{.drafted_seconds = 1.2e-3, .drafted_tokens = 1.08};
  const Tally t = RunSteps(audit, e, 0, 40000, /*count_from=*/20000);
  EXPECT_EQ(audit.verdict(), DraftingAudit::Verdict::kDoesNotPay);
  EXPECT_NEAR(audit.realized_speedup(), 0.9, 0.03);
  // Trials of 128 steps (+16 flush) after no-draft epochs of ~2,700: ~5% of the steps draft.
  EXPECT_GT(t.drafting_steps, 0) << "drafting is tried now and then";
  EXPECT_LT(t.share(), 0.08);
}

TEST(DraftingAuditTest, KeepsDraftingThatPaysWithRareChecks) {
  DraftingAudit audit;
  const Engine e{.drafted_seconds = 1.2e-3, .drafted_tokens = 1.5};  // 1.25x
  const Tally t = RunSteps(audit, e, 0, 40000, /*count_from=*/10000);
  EXPECT_EQ(audit.verdict(), DraftingAudit::Verdict::kPays);
  EXPECT_NEAR(audit.realized_speedup(), 1.25, 0.04);
  // Checks of 64 steps after ~2,500 drafting ones: 2.5% of the steps, 0.5% of the throughput.
  EXPECT_LT(1 - t.share(), 0.04);
  EXPECT_GT(1 - t.share(), 0.0) << "drafting is checked now and then";
}

// On a shared machine the speed drifts: a short epoch compared with the windows on both sides of
// it reads no speedup where drafting changes nothing, though the machine slows 2x over the run.
TEST(DraftingAuditTest, DriftAcrossAPairIsNotASpeedup) {
  DraftingAudit audit;
  const Engine e{.speed = [](int64_t step) { return 1.0 + static_cast<double>(step) / 20000; },
                 .noise = 0.0};
  RunSteps(audit, e, 0, 20000);
  ASSERT_GT(audit.pairs(), 5u);
  EXPECT_NEAR(audit.realized_speedup(), 1.0, 0.01);
  EXPECT_NEAR(audit.last_pair_speedup(), 1.0, 0.01);
}

// Where drafting stops, the target's weights come back into the caches over the next steps: at
// the same yield per step, the 12 steps after the last draft run 2x slower. Counted as drafting
// (the flush), they make drafting lose; counted as the no-draft epoch's they would make it look
// 10-20% ahead.
TEST(DraftingAuditTest, TheStepsAfterDraftingStopsCountAsDrafting) {
  DraftingAudit audit;
  const Engine e{.undrafted = [](int64_t since) { return since < 12 ? 2e-3 : 1e-3; }, .noise = 0.0};
  RunSteps(audit, e, 0, 20000);
  EXPECT_EQ(audit.verdict(), DraftingAudit::Verdict::kDoesNotPay);
  EXPECT_LT(audit.last_pair_speedup(), 0.97);
  EXPECT_GT(audit.last_pair_speedup(), 0.85);
}

// One unlucky first pair does not set the verdict: it waits for two, and the estimate is their
// mean (a paying drafter's first pair read 0.95 in a short run and stopped it for two long
// no-draft epochs).
TEST(DraftingAuditTest, TheFirstVerdictWaitsForTwoPairs) {
  DraftingAudit audit;
  Engine e{.drafted_seconds = 1.2e-3, .drafted_tokens = 1.08, .noise = 0.0};  // 0.9x
  int64_t step = 0;
  for (; audit.pairs() < 1; ++step) RunSteps(audit, e, step, 1);
  EXPECT_EQ(audit.verdict(), DraftingAudit::Verdict::kUnknown);
  EXPECT_NEAR(audit.realized_speedup(), 0.9, 0.01);
  e.drafted_tokens = 1.44;  // 1.2x
  for (; audit.pairs() < 2; ++step) RunSteps(audit, e, step, 1);
  EXPECT_NEAR(audit.realized_speedup(), std::sqrt(0.9 * 1.2), 0.01);
  EXPECT_EQ(audit.verdict(), DraftingAudit::Verdict::kPays);
}

TEST(DraftingAuditTest, StepsThatAreNotSamplesMoveNoEpoch) {
  DraftingAudit audit;
  for (int i = 0; i < 10000; ++i) {
    ASSERT_TRUE(audit.drafting());
    audit.Skip();
    audit.Observe(1e-3, 1, 0, 1e-3);          // no decoding sequence
    audit.Observe(1e-3, 1, 1, 0);             // no yardstick
    audit.Observe(std::nan(""), 1, 1, 1e-3);  // no time
  }
  EXPECT_EQ(audit.ended_pairs(), 0u);
  EXPECT_EQ(audit.verdict(), DraftingAudit::Verdict::kUnknown);
}

// 10 ms steps (batch 64 on the CPU): a 4,096-step long epoch would take 41 s; the time bound
// (2 s) ends it sooner, so that a change of load (here drafting that paid 1.5x reads 0.8x) turns
// the verdict after 37 s instead of 80, but not before 16 times its short epoch's steps
// (long_over_short): with 2 s epochs alone (~200 steps) the 64-step checks took 24% of the steps
// (drafting that pays 1.5x lost 8% of its throughput to them) to turn the verdict in 12 s.
TEST(DraftingAuditTest, ALongEpochEndsWithinItsTimeBoundButOutlastsItsShortOnes) {
  struct Case {
    double bound;
    int32_t ratio;
  };
  for (const Case c : {Case{2.0, 16}, Case{2.0, 0}, Case{1e9, 16}}) {
    SCOPED_TRACE(testing::Message() << "bound " << c.bound << " s, ratio " << c.ratio);
    DraftingAudit audit({.max_long_seconds = c.bound, .long_over_short = c.ratio});
    Engine e{.drafted_seconds = 10e-3,
             .drafted_tokens = 1.5,
             .undrafted = [](int64_t) { return 10e-3; },
             .yardstick = 10e-3};
    RunSteps(audit, e, 0, 3000);
    ASSERT_EQ(audit.verdict(), DraftingAudit::Verdict::kPays);
    const Tally paying = RunSteps(audit, e, 3000, 20000);
    e.drafted_tokens = 0.8;
    int64_t steps = 0;
    while (audit.verdict() == DraftingAudit::Verdict::kPays && steps < 40000) {
      RunSteps(audit, e, 23000 + steps, 100, 0, static_cast<uint32_t>(steps));
      steps += 100;
    }
    const double checks = 1 - paying.share();
    const double seconds = static_cast<double>(steps) * 10e-3;
    if (c.ratio == 0) {
      EXPECT_GT(checks, 0.2) << "2 s epochs alone";
      EXPECT_LT(seconds, 20.0);
    } else {
      EXPECT_LT(checks, 1.0 / 17) << "the checks' share of the steps";
      EXPECT_GT(checks, 0.0);
    }
    if (c.bound == 2.0 && c.ratio > 0) EXPECT_LT(seconds, 60.0) << "seconds before it stopped";
    if (c.bound > 2.0) EXPECT_GT(seconds, 60.0) << "without the bound";
  }
}

// The engine skips keeping a drafter's states for the steps the audit says draft nothing
// (UndraftedStepsAhead): a promise that must hold whatever comes (steps that are not samples,
// steps up to 4x their yardstick, a time bound that ends long epochs early) while covering most
// of the no-draft steps of a drafter that does not pay.
TEST(DraftingAuditTest, TheStepsItSaysDraftNothingDraftNothing) {
  // With 2 s, the long epochs end on their step count; with 0.3 s, on their time, which is
  // counted ahead at 3x the yardstick per step (the most a step counts), so less is covered.
  for (const auto& [bound, share] : {std::pair{2.0, 0.8}, std::pair{0.3, 0.6}}) {
    SCOPED_TRACE(testing::Message() << "max_long_seconds " << bound);
    DraftingAudit audit({.max_long_seconds = bound});
    std::mt19937 rng(5);
    std::uniform_real_distribution<double> slow(0.5, 4.0);
    int64_t promised_until = -1;  // the last step promised to draft nothing
    int64_t undrafted = 0, covered = 0;
    for (int64_t step = 0; step < 60000; ++step) {
      const bool drafting = audit.drafting();
      const int64_t ahead = audit.UndraftedStepsAhead();
      if (drafting) {
        EXPECT_EQ(ahead, 0) << "step " << step;
        ASSERT_LT(promised_until, step) << "step " << step << " drafts within a promise";
      } else {
        EXPECT_GE(ahead, 1);
        ++undrafted;
        if (ahead > 34) ++covered;  // far enough ahead for a 32-token drafter context
      }
      promised_until = std::max(promised_until, step + ahead - 1);
      if (step % 7 == 3) {
        audit.Skip();  // a prompt step
        continue;
      }
      // Drafting yields 0.9x; steps vary up to 4x their yardstick (counted at most 3x).
      const double seconds = 1e-3 * slow(rng) * (drafting ? 1.2 : 1.0);
      audit.Observe(seconds, drafting ? 1.08 : 1.0, 1, 1e-3);
    }
    EXPECT_EQ(audit.verdict(), DraftingAudit::Verdict::kDoesNotPay);
    EXPECT_GT(static_cast<double>(covered) / static_cast<double>(undrafted), share)
        << covered << " of " << undrafted;
  }
}

TEST(DraftingAuditTest, OffItNeverStopsDrafting) {
  DraftingAudit audit({.enabled = false});
  const Engine e{.drafted_seconds = 2e-3, .drafted_tokens = 1};
  const Tally t = RunSteps(audit, e, 0, 5000);
  EXPECT_EQ(t.drafting_steps, t.steps);
  EXPECT_EQ(audit.verdict(), DraftingAudit::Verdict::kUnknown);
}

}  // namespace
}  // namespace specula
