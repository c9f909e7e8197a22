// EAGLE-2's dynamic draft tree (Li et al., 2024), as Beagle drafts it. Torch-free: the drafter
// supplies each expanded node's best children; this class decides what to expand and what to
// keep.
//
//   depth 1:   the root (the pending token) is expanded: its top-k children are candidates.
//   depth d>1: the frontier = the top-k candidates of depth d-1 by cumulative path log
//              probability (sum of the log probabilities along the path); each is expanded into
//              its own top-k children, all of which become candidates of depth d.
//   end:       after `max_depth` depths (or when nothing is left to expand), the tree is the
//              `budget` candidates with the highest path log probability.
//
// A child's path score is its parent's plus a log probability <= 0, so it never outranks its
// parent: ranking by (score desc, depth asc) keeps every kept node's ancestors, and lists parents
// before children, as CandidateTree requires. Expanding more than `budget` children per node, or
// deeper than `budget`, can never pay off, so top-k and depth are capped by the budget. For the
// same reason a frontier node whose score is no better than the budget-th best candidate so far
// can have no descendant in the final tree: with `prune` (default) it is not expanded, which
// saves drafter forwards and never changes the result (tested).
#pragma once

#include <cstdint>
#include <vector>

#include "common/spec/candidate_tree.h"

namespace specula {

struct DraftChild {
  int32_t token = 0;
  float logprob = 0;  // log q(token | the expanded node's path); clamped to <= 0
};

class DynamicTree {
 public:
  // budget = the most nodes the tree may have, max_depth = the deepest node, top_k = children per
  // expanded node and the frontier width. Non-positive values give an empty tree.
  DynamicTree(int32_t budget, int32_t max_depth, int32_t top_k, bool prune = true);

  // The nodes to expand next (-1 = the root), best first; empty when drafting is done.
  const std::vector<int32_t>& frontier() const { return frontier_; }
  // Depth of the children the next Expand adds (1 for the root's).
  int32_t next_depth() const { return depth_ + 1; }
  bool done() const { return frontier_.empty(); }

  // children[i]: the best children of frontier()[i], at most top_k are used (best first). Adds
  // them as candidates and picks the next frontier (none once max_depth is reached).
  void Expand(const std::vector<std::vector<DraftChild>>& children);

  // The kept tree: the `budget` best candidates by path score, parents first.
  CandidateTree Build() const;

  // Every candidate so far (introspection and the drafter's bookkeeping).
  int32_t num_candidates() const { return static_cast<int32_t>(tokens_.size()); }
  int32_t token(int32_t c) const { return tokens_[c]; }
  int32_t parent(int32_t c) const { return parents_[c]; }
  int32_t depth(int32_t c) const { return depths_[c]; }
  double score(int32_t c) const { return scores_[c]; }
  int32_t budget() const { return budget_; }
  int32_t max_depth() const { return max_depth_; }
  int32_t top_k() const { return top_k_; }

 private:
  int32_t budget_, max_depth_, top_k_;
  bool prune_;
  int32_t depth_ = 0;
  std::vector<int32_t> frontier_;
  std::vector<int32_t> tokens_, parents_, depths_;
  std::vector<float> logprobs_;
  std::vector<double> scores_;
};

}  // namespace specula
