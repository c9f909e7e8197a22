// Chi-square goodness-of-fit statistics for the statistical losslessness tests, reported as
// z-scores via the Wilson–Hilferty approximation: (X / k)^(1/3) is close to normal with mean
// 1 - 2 / (9k) and variance 2 / (9k) for X ~ chi-square with k degrees of freedom. A correct
// sampler gives z ~ N(0, 1); tests assert z < 5 (false alarm ~3e-7) and show that a broken sampler
// gives z > 5 at the same sample size.
#pragma once

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace specula {

// z-score of a chi-square statistic with `df` degrees of freedom (0 when df < 1: nothing to test).
inline double WilsonHilfertyZ(double chi_square, int64_t df) {
  if (df < 1) return 0.0;
  const double k = static_cast<double>(df);
  const double v = 2.0 / (9.0 * k);
  return (std::cbrt(chi_square / k) - (1.0 - v)) / std::sqrt(v);
}

namespace chi_square_internal {

struct Cell {
  double expected = 0.0;
  double observed = 0.0;
};

// Pools cells whose expected count is below 5 into one cell; a pool still below 5 joins the
// smallest remaining cell.
inline std::vector<Cell> MergeSmall(const std::vector<Cell>& cells) {
  std::vector<Cell> merged;
  Cell pool;
  bool pooled = false;
  for (const Cell& c : cells) {
    if (c.expected < 5.0) {
      pool.expected += c.expected;
      pool.observed += c.observed;
      pooled = true;
    } else {
      merged.push_back(c);
    }
  }
  if (pooled) {
    if (pool.expected >= 5.0 || merged.empty()) {
      merged.push_back(pool);
    } else {
      auto smallest =
          std::min_element(merged.begin(), merged.end(),
                           [](const Cell& a, const Cell& b) { return a.expected < b.expected; });
      smallest->expected += pool.expected;
      smallest->observed += pool.observed;
    }
  }
  return merged;
}

}  // namespace chi_square_internal

// Goodness of fit of `observed` counts (n draws in all) to `expected` probabilities (normalised
// here). A count in a cell of probability 0 is impossible under the hypothesis: +infinity.
inline double ChiSquareZ(std::span<const int64_t> observed, std::span<const double> expected,
                         int64_t n) {
  assert(observed.size() == expected.size());
  double total_p = 0.0;
  for (double p : expected) total_p += p;
  std::vector<chi_square_internal::Cell> cells;
  for (size_t i = 0; i < observed.size(); ++i) {
    const double e = total_p > 0.0 ? static_cast<double>(n) * expected[i] / total_p : 0.0;
    if (e <= 0.0) {
      if (observed[i] > 0) return std::numeric_limits<double>::infinity();
      continue;
    }
    cells.push_back({e, static_cast<double>(observed[i])});
  }
  cells = chi_square_internal::MergeSmall(cells);
  double x = 0.0;
  for (const auto& c : cells)
    x += (c.observed - c.expected) * (c.observed - c.expected) / c.expected;
  return WilsonHilfertyZ(x, static_cast<int64_t>(cells.size()) - 1);
}

// Two-sample test of homogeneity: do `a` and `b` (counts over the same cells, any sample sizes)
// come from one distribution? Cells where either sample's expected count (under the pooled
// distribution) is below 5 are merged.
inline double ChiSquareTwoSampleZ(std::span<const int64_t> a, std::span<const int64_t> b) {
  assert(a.size() == b.size());
  double na = 0.0, nb = 0.0;
  for (int64_t c : a) na += static_cast<double>(c);
  for (int64_t c : b) nb += static_cast<double>(c);
  if (na <= 0.0 || nb <= 0.0) return 0.0;
  // A cell's expected count in the smaller sample is its pooled total times `small`.
  struct Pair {
    double a = 0.0, b = 0.0;
  };
  const double small = std::min(na, nb) / (na + nb);
  std::vector<Pair> cells;
  Pair pool;
  for (size_t i = 0; i < a.size(); ++i) {
    const double total = static_cast<double>(a[i] + b[i]);
    if (total <= 0.0) continue;
    if (total * small < 5.0) {
      pool.a += static_cast<double>(a[i]);
      pool.b += static_cast<double>(b[i]);
    } else {
      cells.push_back({static_cast<double>(a[i]), static_cast<double>(b[i])});
    }
  }
  if (pool.a + pool.b > 0.0) {
    if ((pool.a + pool.b) * small >= 5.0 || cells.empty()) {
      cells.push_back(pool);
    } else {
      auto smallest =
          std::min_element(cells.begin(), cells.end(),
                           [](const Pair& x, const Pair& y) { return x.a + x.b < y.a + y.b; });
      smallest->a += pool.a;
      smallest->b += pool.b;
    }
  }
  const double ka = std::sqrt(nb / na), kb = std::sqrt(na / nb);
  double x = 0.0;
  for (const Pair& c : cells) {
    const double d = ka * c.a - kb * c.b;
    x += d * d / (c.a + c.b);
  }
  return WilsonHilfertyZ(x, static_cast<int64_t>(cells.size()) - 1);
}

}  // namespace specula
