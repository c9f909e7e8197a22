// The drafter's candidate trees <-> drafter.proto's messages, plus (step_codec.h) the router <->
// target contract's. Decoding validates what a peer could get wrong (array lengths, enum values)
// and names the field.
#pragma once

#include <string>

#include "common/spec/candidate_tree.h"
#include "common/util/status.h"
#include "services/common/step_codec.h"
#include "specula/v1/drafter.pb.h"

namespace specula::services {

// Distributions travel as ProposalDistribution, sparse or dense as the tree holds them.
Status ToProto(const CandidateTree& tree, v1::CandidateTree* out);
// INVALID_ARGUMENT naming the field when the node arrays disagree in length, or a proposal
// distribution breaks drafter.proto's rules: ids and probs of different lengths (dense: probs not
// one per token), an id outside [0, vocab_size), repeated or out of order, a prob that is negative
// or not finite (sparse: above 1), probs summing to 0; or when both it and the old dense
// `distributions` (float32 [vocab_size] tensors, still read) are set. The tree's own rules
// (parents, tokens, budget, sampled tokens inside their proposal) are CandidateTree::Validate's.
StatusOr<CandidateTree> FromProto(const v1::CandidateTree& tree, int32_t vocab_size,
                                  const std::string& field);

}  // namespace specula::services
