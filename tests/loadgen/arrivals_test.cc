// loadgen/arrivals.h: gamma intervals with vLLM's burstiness semantics (mean 1 / rate, variance
// 1 / (rate^2 * burstiness)), the linear ramp-up, the fixed-rate normalization and the flag
// checks. Seeded generators only; no clocks.
#include "loadgen/arrivals.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>

namespace specula::loadgen {
namespace {

struct Moments {
  double mean = 0;
  double variance = 0;
};

Moments IntervalMoments(double rate, double burstiness, int n) {
  std::mt19937_64 rng(7);
  std::vector<double> v(n);
  for (double& x : v) x = SampleInterval(rate, burstiness, rng);
  Moments m;
  m.mean = std::accumulate(v.begin(), v.end(), 0.0) / n;
  for (double x : v) m.variance += (x - m.mean) * (x - m.mean);
  m.variance /= n - 1;
  return m;
}

TEST(ArrivalsTest, PoissonIntervalsHaveMeanAndVarianceOfTheExponential) {
  const Moments m = IntervalMoments(/*rate=*/4, /*burstiness=*/1, 200000);
  EXPECT_NEAR(m.mean, 0.25, 0.25 * 0.01);
  EXPECT_NEAR(m.variance, 1.0 / 16, (1.0 / 16) * 0.03);
}

TEST(ArrivalsTest, BurstinessIsTheGammaShapeAtTheSameMean) {
  for (double burstiness : {0.25, 0.5, 2.0, 8.0}) {
    const Moments m = IntervalMoments(/*rate=*/10, burstiness, 200000);
    EXPECT_NEAR(m.mean, 0.1, 0.1 * 0.015) << burstiness;
    const double variance = 1.0 / (100 * burstiness);
    EXPECT_NEAR(m.variance, variance, variance * 0.05) << burstiness;
  }
}

TEST(ArrivalsTest, InfiniteBurstinessGivesConstantIntervals) {
  std::mt19937_64 rng(1);
  for (int i = 0; i < 5; ++i) {
    EXPECT_DOUBLE_EQ(SampleInterval(5, std::numeric_limits<double>::infinity(), rng), 0.2);
  }
}

TEST(ArrivalsTest, SameSeedSameTimesOtherSeedOtherTimes) {
  ArrivalOptions o{.request_rate = 3, .burstiness = 0.5, .seed = 11};
  const auto a = ArrivalTimes(50, o);
  EXPECT_EQ(a, ArrivalTimes(50, o));
  o.seed = 12;
  EXPECT_NE(a, ArrivalTimes(50, o));
}

TEST(ArrivalsTest, FixedRateTimesAreIncreasingAndEndAtNOverRate) {
  const auto t = ArrivalTimes(40, {.request_rate = 8, .burstiness = 1, .seed = 3});
  ASSERT_EQ(t.size(), 40u);
  EXPECT_GT(t[0], 0);  // as vLLM: the first request waits one interval too
  for (size_t i = 1; i < t.size(); ++i) EXPECT_GE(t[i], t[i - 1]);
  EXPECT_NEAR(t.back(), 40.0 / 8, 1e-9);
}

TEST(ArrivalsTest, ZeroOrInfiniteRateSendsEverythingAtOnce) {
  for (double rate : {0.0, std::numeric_limits<double>::infinity()}) {
    for (double v : ArrivalTimes(10, {.request_rate = rate})) EXPECT_EQ(v, 0) << rate;
  }
  EXPECT_TRUE(ArrivalTimes(0, {.request_rate = 2}).empty());
}

TEST(ArrivalsTest, LinearRampGoesFromStartToEndRate) {
  const ArrivalOptions o{
      .burstiness = 1, .ramp_up_strategy = "linear", .ramp_up_start_rps = 2, .ramp_up_end_rps = 10};
  EXPECT_DOUBLE_EQ(CurrentRequestRate(o, 0, 5), 2);
  EXPECT_DOUBLE_EQ(CurrentRequestRate(o, 2, 5), 6);
  EXPECT_DOUBLE_EQ(CurrentRequestRate(o, 4, 5), 10);
  EXPECT_DOUBLE_EQ(CurrentRequestRate(o, 0, 1), 2);
  // Without a ramp the rate is fixed.
  EXPECT_DOUBLE_EQ(CurrentRequestRate({.request_rate = 3}, 4, 5), 3);
}

TEST(ArrivalsTest, RampedIntervalsShrinkAsTheRateGrows) {
  // Constant intervals (burstiness inf) make each interval exactly 1 / rate(i), not rescaled.
  const ArrivalOptions o{.burstiness = std::numeric_limits<double>::infinity(),
                         .ramp_up_strategy = "linear",
                         .ramp_up_start_rps = 1,
                         .ramp_up_end_rps = 4};
  const auto t = ArrivalTimes(4, o);
  ASSERT_EQ(t.size(), 4u);
  EXPECT_DOUBLE_EQ(t[0], 1.0);
  EXPECT_NEAR(t[1] - t[0], 1.0 / 2, 1e-12);
  EXPECT_NEAR(t[2] - t[1], 1.0 / 3, 1e-12);
  EXPECT_NEAR(t[3] - t[2], 1.0 / 4, 1e-12);
  // With gamma intervals the mean interval of the fast end is shorter than of the slow end.
  ArrivalOptions g = o;
  g.burstiness = 1;
  g.ramp_up_end_rps = 20;
  const auto r = ArrivalTimes(2000, g);
  const double first = r[199] / 200, last = (r[1999] - r[1799]) / 200;
  EXPECT_GT(first, 2 * last);
}

TEST(ArrivalsTest, ValidationNamesTheFlag) {
  auto message = [](const ArrivalOptions& o) { return ValidateArrivals(o).message(); };
  EXPECT_TRUE(ValidateArrivals({.request_rate = 2}).ok());
  EXPECT_NE(message({.burstiness = 0}).find("--burstiness"), std::string::npos);
  EXPECT_NE(message({.request_rate = -1}).find("--request-rate"), std::string::npos);
  EXPECT_NE(
      message({.ramp_up_strategy = "exponential", .ramp_up_end_rps = 2}).find("--ramp-up-strategy"),
      std::string::npos);
  EXPECT_NE(message({.ramp_up_strategy = "linear", .ramp_up_start_rps = 5, .ramp_up_end_rps = 2})
                .find("--ramp-up-start-rps"),
            std::string::npos);
  EXPECT_NE(message({.request_rate = 3, .ramp_up_strategy = "linear", .ramp_up_end_rps = 2})
                .find("--request-rate"),
            std::string::npos);
}

}  // namespace
}  // namespace specula::loadgen
