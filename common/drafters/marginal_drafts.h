// Candidate trees from per-depth draft distributions that do not depend on the parent (SpecFormer's
// slots, ParallelSpec's real + mask rows): row j of the logits drafts depth j + 1 whatever token
// was drafted above it. Three shapes:
//   - a chain: each depth's argmax, or for sampled requests a token sampled from the shaped
//     distribution (cut to its top proposal_top_k tokens, 0 = dense) with that distribution
//     attached (the lossless rejection verifier needs it);
//   - a budgeted tree: the `budget` nodes with the highest path probability (best-first);
//   - a static tree (Medusa's): a fixed list of rank paths, read from JSON.
// Tree candidates are deterministic, so verification stays lossless for sampled requests too
// (point masses in the verifier; the paper's min(1, p/q) on a static top-k tree is not lossless).
// Torch-free.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/sampling/sampler.h"
#include "common/spec/candidate_tree.h"
#include "common/util/status.h"

namespace specula {

// Per-depth logits of one request: row j ([vocab] float32) drafts depth j + 1.
struct DepthLogits {
  const float* data = nullptr;
  int64_t vocab = 0;
  std::span<const float> Row(int64_t j) const {
    return {data + j * vocab, static_cast<size_t>(vocab)};
  }
};

// Adds one chain node below `parent` drafted from `row`: its argmax (greedy), or a token sampled
// from the shaped distribution cut to its top `proposal_top_k` tokens (0 = dense), with that
// distribution attached (sampled requests; AddSampledNode). Returns the node's token.
int32_t AddChainNode(CandidateTree& tree, int32_t parent, std::span<const float> row,
                     const SamplingParams& sampling, SequenceRng& rng, int32_t proposal_top_k);

// A chain of `depth` nodes, one per row (AddChainNode).
CandidateTree DraftMarginalChain(const DepthLogits& rows, int32_t depth,
                                 const SamplingParams& sampling, SequenceRng& rng,
                                 int32_t proposal_top_k);

// The `budget` nodes with the highest products of row probabilities along their paths, no deeper
// than `depth`. Best-first: the best node overall is row 0's best token; after taking a node, the
// next candidates it opens are its next-best sibling and its best child, both no more probable
// than itself, so nodes come out in non-increasing path probability and every parent before its
// children. Ties keep discovery order. Tokens of probability 0 (top-k / top-p) are never drafted.
CandidateTree DraftMarginalTree(const DepthLogits& rows, int32_t depth, int32_t budget,
                                const SamplingParams& sampling);

// Medusa's static tree: each node a path of ranks from the root ({0} = depth 1's best token,
// {0, 1} = its child of depth 2's second-best token). Paths are kept in file order after a stable
// sort by length, so a parent always comes before its children.
class StaticDraftTree {
 public:
  // JSON: an array of paths ([[0], [1], [0, 0], ...]) or {"paths": [...]}. INVALID_ARGUMENT
  // naming `source` and the path: not an array of arrays of non-negative integers, an empty or
  // repeated path, a path whose parent is missing.
  static StatusOr<StaticDraftTree> FromJson(std::string_view json, std::string_view source);
  static StatusOr<StaticDraftTree> FromFile(const std::string& path);

  // The tree's first `budget` nodes no deeper than `depth` (and the depths rows has), ranked by
  // each row's probabilities; a node whose rank has probability 0 is left out with its subtree.
  CandidateTree Draft(const DepthLogits& rows, int32_t depth, int32_t budget,
                      const SamplingParams& sampling) const;

  int32_t max_depth() const { return max_depth_; }
  size_t size() const { return paths_.size(); }

 private:
  std::vector<std::vector<int32_t>> paths_;
  std::vector<int32_t> parent_;  // index of each path's parent path, -1 for depth 1
  int32_t max_depth_ = 0;
  int32_t max_rank_ = 0;
};

}  // namespace specula
