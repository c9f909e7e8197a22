// A drafter's proposal for one sequence and one step: a tree of candidate tokens hanging off the
// sequence's pending token (the last token it generated, not yet run through the target).
//
// Node i has a token, a parent (-1 = a child of the pending token, else an earlier node), and the
// proposal it came from, which the lossless sampling verifier needs:
//   - deterministic (proposal -1): the drafter chose the token (argmax, top-k, n-gram lookup). The
//     verifier treats it as a point mass, so any deterministic candidate set stays lossless.
//   - sampled (proposal j >= 0): the token was drawn from distribution j, independently of its
//     siblings (siblings drawn from one distribution are i.i.d. samples, as in SpecInfer).
// A distribution is dense (probabilities over the whole vocabulary: distribution_ids(j) empty,
// distribution(j) has vocab entries) or sparse (distribution(j)[k] is the probability of token
// distribution_ids(j)[k]; every other token has probability 0). Sparse ones are what a drafter
// sends over the network after top-k truncation (common/spec/proposal.h); the drafter must have
// sampled from exactly that sparse distribution, so verification stays lossless. Values need not
// sum exactly to 1: verifiers normalise them.
// Torch-free.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/util/status.h"

namespace specula {

class CandidateTree {
 public:
  CandidateTree() = default;

  // A chain of deterministic candidates: token i is the child of token i - 1.
  static CandidateTree Chain(std::span<const int32_t> tokens);
  // No tree: the drafter could not draft for this one sequence (e.g. a remote drafter that lost
  // its state). Empty, and Validate returns `why`, so the engine counts a draft error for this
  // sequence only and it decodes without a draft this step. `why` must not be OK.
  static CandidateTree Failed(Status why);
  const Status& failure() const { return failure_; }

  // Appends a node; returns its index. `draft_prob` is the drafter's probability of the token
  // given its parent's path (reported in stats and used to rank; 1 when unknown).
  int32_t AddNode(int32_t parent, int32_t token, float draft_prob = 1.0f, int32_t proposal = -1);
  // Adds a dense proposal distribution: probs[v] for every token v of the vocabulary. Returns its
  // index for AddNode.
  int32_t AddDistribution(std::vector<float> probs);
  // Adds a sparse proposal distribution: probs[k] for token ids[k] (ids strictly increasing),
  // probability 0 for every other token. Returns its index for AddNode.
  int32_t AddSparseDistribution(std::vector<int32_t> ids, std::vector<float> probs);
  // Keeps the first n nodes (still a tree: parents come before their children) and the
  // distributions up to the last one they use.
  void Truncate(int32_t n);

  int32_t size() const { return static_cast<int32_t>(tokens_.size()); }
  bool empty() const { return tokens_.empty(); }
  int32_t token(int32_t i) const { return tokens_[i]; }
  int32_t parent(int32_t i) const { return parents_[i]; }
  // 1 for children of the pending token.
  int32_t depth(int32_t i) const { return depths_[i]; }
  float draft_prob(int32_t i) const { return draft_probs_[i]; }
  int32_t proposal(int32_t i) const { return proposals_[i]; }
  int32_t num_distributions() const { return static_cast<int32_t>(distributions_.size()); }
  // Distribution j's values: [vocab] when dense, else one per entry of distribution_ids(j).
  std::span<const float> distribution(int32_t j) const { return distributions_[j]; }
  // Distribution j's token ids, strictly increasing; empty when it is dense.
  std::span<const int32_t> distribution_ids(int32_t j) const { return distribution_ids_[j]; }
  bool distribution_is_dense(int32_t j) const { return distribution_ids_[j].empty(); }
  // Distribution j's (unnormalised) value for `token`: 0 for a token outside a sparse
  // distribution's ids or outside a dense one's range.
  float ProposalProbability(int32_t j, int32_t token) const;
  int32_t max_depth() const;

  const std::vector<int32_t>& tokens() const { return tokens_; }
  const std::vector<int32_t>& parents() const { return parents_; }

  // Children of `node` (-1 = the pending token) in insertion order, the order the verifier tries
  // them in.
  std::vector<int32_t> Children(int32_t node) const;
  // Node indices from the root's child down to `node`.
  std::vector<int32_t> PathTo(int32_t node) const;

  // failure() if the tree is Failed; else INVALID_ARGUMENT naming the node or distribution and the
  // field: a parent that does not precede its child, a token outside [0, vocab_size), more than
  // max_nodes nodes, deeper than max_depth, a probability outside [0, 1], an unknown proposal, a
  // dense distribution of the wrong size or with an entry that is negative or not finite, a sparse
  // one whose ids and probs differ in length or whose ids are outside [0, vocab_size) or not
  // strictly increasing or whose probs are outside [0, 1], a distribution that sums to 0, or one
  // that gives its own sampled token probability 0.
  Status Validate(int32_t vocab_size, int32_t max_nodes, int32_t max_depth) const;

 private:
  // Validate's rules for distribution j.
  Status ValidateDistribution(int32_t j, int32_t vocab_size) const;

  std::vector<int32_t> tokens_;
  std::vector<int32_t> parents_;
  std::vector<int32_t> depths_;
  std::vector<float> draft_probs_;
  std::vector<int32_t> proposals_;
  std::vector<std::vector<float>> distributions_;       // values: [vocab] dense, else per id
  std::vector<std::vector<int32_t>> distribution_ids_;  // empty = dense
  Status failure_;                                      // OK unless Failed
};

}  // namespace specula
