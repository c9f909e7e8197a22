// The engine's types <-> the internal services' messages (target.proto, drafter.proto). Decoding
// validates what a peer could get wrong (array lengths, enum values) and names the field.
#pragma once

#include <string>

#include "common/spec/candidate_tree.h"
#include "common/spec/drafter.h"
#include "common/spec/target_backend.h"
#include "common/util/status.h"
#include "specula/v1/drafter.pb.h"
#include "specula/v1/target.pb.h"

namespace specula::services {

v1::VerifyMode ToProto(VerifyMode mode);
StatusOr<VerifyMode> FromProto(v1::VerifyMode mode, const std::string& field);

void ToProto(const SamplingParams& params, v1::SamplingParams* out);
SamplingParams FromProto(const v1::SamplingParams& params);

void ToProto(const SpecRequest& request, v1::EngineRequest* out);
StatusOr<SpecRequest> FromProto(const v1::EngineRequest& request, const std::string& field);

void ToProto(const StepPlan& plan, v1::StepPlan* out);
StatusOr<StepPlan> FromProto(const v1::StepPlan& plan);

void ToProto(const StepOutcome& outcome, v1::StepResult* out);
StepOutcome FromProto(const v1::StepResult& result);

void ToProto(const TargetInfo& info, v1::TargetInfo* out);
TargetInfo FromProto(const v1::TargetInfo& info);

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
