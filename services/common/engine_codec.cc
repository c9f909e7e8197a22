#include "services/common/engine_codec.h"

#include <cmath>
#include <cstring>
#include <span>
#include <string>
#include <utility>

#include "services/common/grpc_status.h"
#include "services/common/tensor_codec.h"

namespace specula::services {

Status ToProto(const CandidateTree& tree, v1::CandidateTree* out) {
  for (int32_t i = 0; i < tree.size(); ++i) {
    out->add_tokens(tree.token(i));
    out->add_parents(tree.parent(i));
    out->add_draft_probs(tree.draft_prob(i));
    out->add_proposals(tree.proposal(i));
  }
  for (int32_t j = 0; j < tree.num_distributions(); ++j) {
    const std::span<const int32_t> ids = tree.distribution_ids(j);
    const std::span<const float> probs = tree.distribution(j);
    v1::ProposalDistribution* d = out->add_proposal_distributions();
    d->mutable_ids()->Assign(ids.begin(), ids.end());
    d->mutable_probs()->Assign(probs.begin(), probs.end());
  }
  return OkStatus();
}

namespace {

// A distribution's values: each finite and >= 0 (a sparse one's each <= 1 too), summing above 0.
// The verifier divides by them and subtracts them from the target's probabilities.
Status CheckProbabilities(std::span<const float> probs, bool dense, const std::string& name) {
  double total = 0.0;
  for (size_t k = 0; k < probs.size(); ++k) {
    const float p = probs[k];
    if (!(p >= 0.0f) || !std::isfinite(p) || (!dense && p > 1.0f)) {
      return InvalidArgumentError(StrCat(name, "[", k, "] = ", p, " is not a probability (",
                                         dense ? "finite and >= 0" : "in [0, 1]", ")"));
    }
    total += p;
  }
  if (!(total > 0.0)) return InvalidArgumentError(StrCat(name, " sum to 0"));
  return OkStatus();
}

// One ProposalDistribution (drafter.proto's rules), added to `out`. `name` is its field.
Status AddProposalDistribution(const v1::ProposalDistribution& d, int32_t vocab_size,
                               const std::string& name, CandidateTree& out) {
  const bool dense = d.ids_size() == 0;
  if (dense && d.probs_size() != vocab_size) {
    return InvalidArgumentError(StrCat(name, ".probs: ", d.probs_size(),
                                       " entries with no ids; a dense distribution has one per "
                                       "token of the vocabulary (",
                                       vocab_size, ")"));
  }
  if (!dense && d.probs_size() != d.ids_size()) {
    return InvalidArgumentError(StrCat(name, ": ", d.ids_size(), " ids but ", d.probs_size(),
                                       " probs (a sparse distribution has one prob per id)"));
  }
  for (int k = 0; k < d.ids_size(); ++k) {
    const int32_t id = d.ids(k);
    if (id < 0 || id >= vocab_size) {
      return InvalidArgumentError(
          StrCat(name, ".ids[", k, "] = ", id, " is outside the vocabulary [0, ", vocab_size, ")"));
    }
    if (k > 0 && id <= d.ids(k - 1)) {
      return InvalidArgumentError(StrCat(name, ".ids[", k, "] = ", id,
                                         id == d.ids(k - 1) ? " repeats" : " is out of order",
                                         " (ids must be strictly increasing)"));
    }
  }
  std::vector<float> probs(d.probs().begin(), d.probs().end());
  RETURN_IF_ERROR(CheckProbabilities(probs, dense, StrCat(name, ".probs")));
  if (dense) {
    out.AddDistribution(std::move(probs));
  } else {
    out.AddSparseDistribution(std::vector<int32_t>(d.ids().begin(), d.ids().end()),
                              std::move(probs));
  }
  return OkStatus();
}

}  // namespace

StatusOr<CandidateTree> FromProto(const v1::CandidateTree& tree, int32_t vocab_size,
                                  const std::string& field) {
  const int n = tree.tokens_size();
  if (tree.parents_size() != n || tree.draft_probs_size() != n || tree.proposals_size() != n) {
    return InvalidArgumentError(StrCat(field,
                                       ": tokens, parents, draft_probs and proposals must "
                                       "have one entry per node, got ",
                                       n, ", ", tree.parents_size(), ", ", tree.draft_probs_size(),
                                       ", ", tree.proposals_size()));
  }
  if (tree.distributions_size() > 0 && tree.proposal_distributions_size() > 0) {
    return InvalidArgumentError(StrCat(field, ": both distributions (", tree.distributions_size(),
                                       ") and proposal_distributions (",
                                       tree.proposal_distributions_size(),
                                       ") are set; send only proposal_distributions"));
  }
  CandidateTree out;
  for (int j = 0; j < tree.proposal_distributions_size(); ++j) {
    RETURN_IF_ERROR(AddProposalDistribution(tree.proposal_distributions(j), vocab_size,
                                            StrCat(field, ".proposal_distributions[", j, "]"),
                                            out));
  }
  // The dense tensors of older drafters.
  for (int j = 0; j < tree.distributions_size(); ++j) {
    const v1::Tensor& t = tree.distributions(j);
    const std::string name = StrCat(field, ".distributions[", j, "]");
    if (t.dtype() != v1::DTYPE_FLOAT32 || t.shape_size() != 1 || t.shape(0) != vocab_size ||
        t.data().size() != static_cast<size_t>(vocab_size) * sizeof(float)) {
      return InvalidArgumentError(StrCat(name, ": expected a float32 [", vocab_size,
                                         "] tensor with ", static_cast<int64_t>(vocab_size) * 4,
                                         " bytes of data"));
    }
    std::vector<float> probs(static_cast<size_t>(vocab_size));
    std::memcpy(probs.data(), t.data().data(), probs.size() * sizeof(float));
    RETURN_IF_ERROR(CheckProbabilities(probs, /*dense=*/true, StrCat(name, ".data")));
    out.AddDistribution(std::move(probs));
  }
  for (int i = 0; i < n; ++i) {
    // Bad parents, tokens and proposals are CandidateTree::Validate's to report (the engine runs
    // it on every tree, local or remote); AddNode never dereferences a bad parent.
    out.AddNode(tree.parents(i), tree.tokens(i), tree.draft_probs(i), tree.proposals(i));
  }
  return out;
}

}  // namespace specula::services
