#include "common/drafters/beagle/dynamic_tree.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

namespace specula {

DynamicTree::DynamicTree(int32_t budget, int32_t max_depth, int32_t top_k, bool prune)
    : budget_(std::max(budget, 0)),
      max_depth_(std::clamp(max_depth, 0, std::max(budget, 0))),
      top_k_(std::clamp(top_k, 0, std::max(budget, 0))),
      prune_(prune) {
  if (budget_ > 0 && max_depth_ > 0 && top_k_ > 0) frontier_ = {-1};
}

void DynamicTree::Expand(const std::vector<std::vector<DraftChild>>& children) {
  if (frontier_.empty()) return;
  ++depth_;
  std::vector<int32_t> added;
  const size_t n = std::min(children.size(), frontier_.size());
  for (size_t i = 0; i < n; ++i) {
    const int32_t parent = frontier_[i];
    const double base = parent < 0 ? 0.0 : scores_[parent];
    const size_t k = std::min(children[i].size(), static_cast<size_t>(top_k_));
    for (size_t c = 0; c < k; ++c) {
      const float lp = std::min(children[i][c].logprob, 0.0f);
      if (!std::isfinite(lp)) continue;  // probability 0: never a candidate
      added.push_back(static_cast<int32_t>(tokens_.size()));
      tokens_.push_back(children[i][c].token);
      parents_.push_back(parent);
      depths_.push_back(depth_);
      logprobs_.push_back(lp);
      scores_.push_back(base + lp);
    }
  }
  frontier_.clear();
  if (depth_ >= max_depth_) return;
  // Next frontier: this depth's best top_k by path score (ties: discovery order).
  std::stable_sort(added.begin(), added.end(),
                   [&](int32_t a, int32_t b) { return scores_[a] > scores_[b]; });
  if (added.size() > static_cast<size_t>(top_k_)) added.resize(top_k_);
  if (prune_ && scores_.size() >= static_cast<size_t>(budget_)) {
    // The budget-th best score so far: a node scoring no better (ties go to the shallower, so
    // to candidates already there) has no descendant in the final tree.
    std::vector<double> best(scores_);
    std::nth_element(best.begin(), best.begin() + (budget_ - 1), best.end(), std::greater<>());
    const double bar = best[budget_ - 1];
    std::erase_if(added, [&](int32_t c) { return scores_[c] <= bar; });
  }
  frontier_ = std::move(added);
}

CandidateTree DynamicTree::Build() const {
  std::vector<int32_t> order(tokens_.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    if (scores_[a] != scores_[b]) return scores_[a] > scores_[b];
    return depths_[a] < depths_[b];
  });
  CandidateTree tree;
  std::vector<int32_t> index(tokens_.size(), -1);  // candidate -> tree node
  for (int32_t c : order) {
    if (tree.size() >= budget_) break;
    const int32_t parent = parents_[c];
    if (parent >= 0 && index[parent] < 0) continue;  // ancestor not kept (cannot happen; cheap)
    index[c] = tree.AddNode(parent < 0 ? -1 : index[parent], tokens_[c],
                            static_cast<float>(std::exp(logprobs_[c])));
  }
  return tree;
}

}  // namespace specula
