// Proposal distributions a sampling drafter draws its candidates from, and their top-k truncation.
//
// A drafter that sends its tree over the network (services/drafter) cuts each proposal to its k
// most likely tokens before sampling, so a sampled node costs O(k) bytes instead of O(vocab)
// (vocab 4096: 16 KiB dense, about 0.4 KiB at k = 64). The truncated distribution is a different
// proposal q', not an approximation of q: the drafter samples from exactly q' and attaches q', and
// recursive rejection sampling is lossless for any proposal the candidate was drawn from, so
// sampled output keeps exactly the target's distribution (a smaller k only lowers acceptance a
// little where q's tail mattered). Torch-free.
#pragma once

#include <cstdint>
#include <vector>

#include "common/sampling/sampler.h"
#include "common/spec/candidate_tree.h"

namespace specula {

// One proposal distribution, dense or sparse (CandidateTree's two forms).
struct Proposal {
  std::vector<int32_t> ids;  // strictly increasing token ids; empty = dense
  std::vector<float> probs;  // [vocab] when dense, else one per id
  bool dense() const { return ids.empty(); }
};

// `probs` ([vocab], a distribution) cut to its k most probable tokens with positive probability
// (ties to the lower id, as Argmax and top-k sampling break them), renormalised to sum 1, ids
// ascending. k <= 0, k at least the vocabulary with every token positive, or no positive entry,
// keeps `probs` dense and unchanged. A distribution with fewer than k positive
// entries becomes sparse over exactly those entries (renormalised).
Proposal TopKProposal(std::vector<float> probs, int32_t k);

// Draws a token from `q` (any positive total; need not sum exactly to 1).
int32_t SampleProposal(const Proposal& q, SequenceRng& rng);

// q's value for `token` (0 outside a sparse q's ids).
float ProposalProbability(const Proposal& q, int32_t token);

// Adds `q` to `tree` (AddDistribution or AddSparseDistribution); returns its index for AddNode.
int32_t AddProposal(CandidateTree& tree, Proposal q);

// Truncates probs to top-k (TopKProposal), samples a token from the truncated proposal, attaches
// that proposal to `tree` and adds the token as a sampled child of `parent` with draft_prob its
// probability under the proposal. Returns the new node's index.
int32_t AddSampledNode(CandidateTree& tree, int32_t parent, std::vector<float> probs, int32_t k,
                       SequenceRng& rng);

}  // namespace specula
