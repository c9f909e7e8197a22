// EAGLE-2's dynamic tree (common/drafters/beagle/dynamic_tree) on synthetic child distributions:
// it never exceeds its budget or depth, keeps exactly the best candidates by path score with
// every ancestor, expands the best top-k of each depth, and degenerates to the argmax chain.
#include "common/drafters/beagle/dynamic_tree.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>

namespace specula {
namespace {

constexpr int32_t kVocab = 50;

// Children of a node, best first: a random distribution that depends on the node's path only.
std::vector<DraftChild> Children(uint64_t path_hash, int32_t k) {
  std::mt19937_64 rng(path_hash);
  std::vector<double> w(kVocab);
  double sum = 0;
  for (auto& x : w) {
    x = std::pow(std::uniform_real_distribution<double>(0, 1)(rng), 4.0);
    sum += x;
  }
  std::vector<DraftChild> all;
  for (int32_t t = 0; t < kVocab; ++t) {
    all.push_back({t, static_cast<float>(std::log(w[t] / sum))});
  }
  std::stable_sort(all.begin(), all.end(),
                   [](const DraftChild& a, const DraftChild& b) { return a.logprob > b.logprob; });
  all.resize(std::min<size_t>(k, all.size()));
  return all;
}

uint64_t PathHash(const DynamicTree& t, int32_t c) {
  uint64_t h = 1469598103934665603ull;
  for (; c >= 0; c = t.parent(c))
    h = (h ^ static_cast<uint64_t>(t.token(c) + 1)) * 1099511628211ull;
  return h;
}

DynamicTree RunTree(int32_t budget, int32_t depth, int32_t top_k, int* expansions = nullptr,
                    bool prune = true) {
  DynamicTree t(budget, depth, top_k, prune);
  int n = 0;
  while (!t.done()) {
    std::vector<std::vector<DraftChild>> children;
    for (int32_t f : t.frontier()) children.push_back(Children(PathHash(t, f), t.top_k()));
    t.Expand(children);
    ++n;
  }
  if (expansions) *expansions = n;
  return t;
}

TEST(DynamicTreeTest, NeverExceedsBudgetOrDepth) {
  for (int32_t budget : {0, 1, 2, 5, 16, 60, 200}) {
    for (int32_t depth : {0, 1, 3, 6, 10}) {
      for (int32_t top_k : {1, 3, 10}) {
        int expansions = 0;
        DynamicTree t = RunTree(budget, depth, top_k, &expansions);
        CandidateTree tree = t.Build();
        const int32_t cap = std::min(budget, kVocab * 1000);
        EXPECT_LE(tree.size(), cap);
        EXPECT_LE(tree.max_depth(), std::max(depth, 0));
        EXPECT_TRUE(tree.Validate(kVocab, std::max(budget, 0), std::max(depth, 0)).ok())
            << tree.Validate(kVocab, std::max(budget, 0), std::max(depth, 0));
        EXPECT_LE(expansions, std::min(std::max(depth, 0), std::max(budget, 0)));
        if (budget > 0 && depth > 0 && top_k > 0) {
          EXPECT_EQ(tree.size(), std::min(budget, t.num_candidates()));
        } else {
          EXPECT_TRUE(tree.empty());
        }
      }
    }
  }
}

// Pruning frontier nodes that cannot reach the final tree saves expansions and changes nothing.
TEST(DynamicTreeTest, PruningNeverChangesTheTree) {
  int64_t rows_pruned = 0, rows_full = 0;
  for (int32_t budget : {1, 3, 8, 16, 60}) {
    for (int32_t depth : {2, 6}) {
      for (int32_t top_k : {2, 4, 10}) {
        DynamicTree pruned = RunTree(budget, depth, top_k, nullptr, true);
        DynamicTree full = RunTree(budget, depth, top_k, nullptr, false);
        const CandidateTree a = pruned.Build(), b = full.Build();
        EXPECT_EQ(a.tokens(), b.tokens()) << budget << " " << depth << " " << top_k;
        EXPECT_EQ(a.parents(), b.parents()) << budget << " " << depth << " " << top_k;
        rows_pruned += pruned.num_candidates();
        rows_full += full.num_candidates();
      }
    }
  }
  EXPECT_LT(rows_pruned, rows_full) << "pruning never saved an expansion";
  std::printf("candidates drafted: %ld pruned vs %ld full\n", static_cast<long>(rows_pruned),
              static_cast<long>(rows_full));
}

TEST(DynamicTreeTest, KeepsTheBestCandidatesWithTheirAncestors) {
  DynamicTree t = RunTree(/*budget=*/40, /*depth=*/6, /*top_k=*/8);
  CandidateTree tree = t.Build();
  ASSERT_EQ(tree.size(), 40);
  // Map tree nodes back to candidates by path (tokens from the root).
  std::set<std::vector<int32_t>> kept;
  for (int32_t i = 0; i < tree.size(); ++i) {
    std::vector<int32_t> path;
    for (int32_t n : tree.PathTo(i)) path.push_back(tree.token(n));
    kept.insert(path);
  }
  double worst_kept = 0, best_dropped = -1e30;
  for (int32_t c = 0; c < t.num_candidates(); ++c) {
    std::vector<int32_t> path;
    for (int32_t a = c; a >= 0; a = t.parent(a)) path.insert(path.begin(), t.token(a));
    if (kept.count(path)) {
      worst_kept = std::min(worst_kept, t.score(c));
    } else {
      best_dropped = std::max(best_dropped, t.score(c));
    }
  }
  EXPECT_GE(worst_kept, best_dropped) << "a better candidate was dropped";
  // Path scores are sums of the nodes' log probabilities.
  for (int32_t i = 0; i < tree.size(); ++i) {
    EXPECT_GT(tree.draft_prob(i), 0.0f);
    EXPECT_LE(tree.draft_prob(i), 1.0f);
  }
}

TEST(DynamicTreeTest, ExpandsTheBestTopKOfEachDepth) {
  DynamicTree t(/*budget=*/60, /*depth=*/4, /*top_k=*/5);
  ASSERT_EQ(t.frontier(), std::vector<int32_t>{-1});
  t.Expand({Children(1, 5)});
  ASSERT_EQ(t.frontier().size(), 5u);  // the root's 5 children
  std::vector<std::vector<DraftChild>> children;
  for (int32_t f : t.frontier()) children.push_back(Children(100 + f, 5));
  t.Expand(children);
  // 25 candidates at depth 2; the frontier is their best 5 by path score, best first.
  std::vector<double> depth2;
  for (int32_t c = 0; c < t.num_candidates(); ++c) {
    if (t.depth(c) == 2) depth2.push_back(t.score(c));
  }
  ASSERT_EQ(depth2.size(), 25u);
  std::sort(depth2.rbegin(), depth2.rend());
  ASSERT_EQ(t.frontier().size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_DOUBLE_EQ(t.score(t.frontier()[i]), depth2[i]);
  EXPECT_EQ(t.next_depth(), 3);
}

TEST(DynamicTreeTest, TopOneIsTheArgmaxChain) {
  DynamicTree t = RunTree(/*budget=*/5, /*depth=*/5, /*top_k=*/1);
  CandidateTree tree = t.Build();
  ASSERT_EQ(tree.size(), 5);
  for (int32_t i = 0; i < tree.size(); ++i) {
    EXPECT_EQ(tree.parent(i), i - 1);
    // Candidate i is tree node i here (scores fall along the chain).
    EXPECT_EQ(tree.token(i), Children(PathHash(t, i - 1), 1)[0].token);
    EXPECT_EQ(t.token(i), tree.token(i));
  }
}

TEST(DynamicTreeTest, ZeroProbabilityChildrenAreNeverCandidates) {
  DynamicTree t(10, 2, 3);
  t.Expand({{{4, 0.0f}, {7, -std::numeric_limits<float>::infinity()}, {9, -1.0f}}});
  EXPECT_EQ(t.num_candidates(), 2);
  EXPECT_EQ(t.frontier().size(), 2u);
}

}  // namespace
}  // namespace specula
