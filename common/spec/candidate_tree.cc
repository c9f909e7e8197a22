#include "common/spec/candidate_tree.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace specula {

CandidateTree CandidateTree::Chain(std::span<const int32_t> tokens) {
  CandidateTree tree;
  for (size_t i = 0; i < tokens.size(); ++i) {
    tree.AddNode(static_cast<int32_t>(i) - 1, tokens[i]);
  }
  return tree;
}

int32_t CandidateTree::AddNode(int32_t parent, int32_t token, float draft_prob, int32_t proposal) {
  const int32_t index = size();
  // A parent that does not precede the node gets depth 0, which Validate rejects (trees may come
  // from a network peer, so a bad parent must never be dereferenced here).
  int32_t depth = 0;
  if (parent == -1) {
    depth = 1;
  } else if (parent >= 0 && parent < index) {
    depth = depths_[parent] + 1;
  }
  tokens_.push_back(token);
  parents_.push_back(parent);
  depths_.push_back(depth);
  draft_probs_.push_back(draft_prob);
  proposals_.push_back(proposal);
  return index;
}

int32_t CandidateTree::AddDistribution(std::vector<float> probs) {
  distributions_.push_back(std::move(probs));
  distribution_ids_.emplace_back();
  return num_distributions() - 1;
}

int32_t CandidateTree::AddSparseDistribution(std::vector<int32_t> ids, std::vector<float> probs) {
  distributions_.push_back(std::move(probs));
  distribution_ids_.push_back(std::move(ids));
  return num_distributions() - 1;
}

void CandidateTree::Truncate(int32_t n) {
  if (n < 0 || n >= size()) return;
  tokens_.resize(n);
  parents_.resize(n);
  depths_.resize(n);
  draft_probs_.resize(n);
  proposals_.resize(n);
  int32_t used = 0;
  for (int32_t j : proposals_) used = std::max(used, j + 1);
  if (used < num_distributions()) {
    distributions_.resize(used);
    distribution_ids_.resize(used);
  }
}

float CandidateTree::ProposalProbability(int32_t j, int32_t token) const {
  const std::vector<float>& values = distributions_[j];
  const std::vector<int32_t>& ids = distribution_ids_[j];
  if (ids.empty()) {
    return token >= 0 && static_cast<size_t>(token) < values.size() ? values[token] : 0.0f;
  }
  // Validate guarantees strictly increasing ids; on an unvalidated tree this may miss a token.
  const auto it = std::lower_bound(ids.begin(), ids.end(), token);
  if (it == ids.end() || *it != token) return 0.0f;
  const size_t k = static_cast<size_t>(it - ids.begin());
  return k < values.size() ? values[k] : 0.0f;
}

int32_t CandidateTree::max_depth() const {
  int32_t deepest = 0;
  for (int32_t d : depths_) deepest = std::max(deepest, d);
  return deepest;
}

std::vector<int32_t> CandidateTree::Children(int32_t node) const {
  std::vector<int32_t> children;
  for (int32_t i = 0; i < size(); ++i) {
    if (parents_[i] == node) children.push_back(i);
  }
  return children;
}

std::vector<int32_t> CandidateTree::PathTo(int32_t node) const {
  std::vector<int32_t> path;
  if (node < 0 || node >= size()) return path;
  // Follows only parents that precede their child, so a malformed tree cannot loop.
  int32_t current = node;
  while (true) {
    path.push_back(current);
    const int32_t parent = parents_[current];
    if (parent < 0 || parent >= current) break;
    current = parent;
  }
  std::reverse(path.begin(), path.end());
  return path;
}

CandidateTree CandidateTree::Failed(Status why) {
  CandidateTree tree;
  tree.failure_ = why.ok() ? InternalError("drafting failed") : std::move(why);
  return tree;
}

Status CandidateTree::ValidateDistribution(int32_t j, int32_t vocab_size) const {
  const std::vector<float>& q = distributions_[j];
  const std::vector<int32_t>& ids = distribution_ids_[j];
  double total = 0.0;
  if (ids.empty()) {
    if (static_cast<int64_t>(q.size()) != vocab_size) {
      return InvalidArgumentError(StrCat("candidate tree distribution ", j, ": size ", q.size(),
                                         " differs from the vocabulary size ", vocab_size));
    }
    for (size_t v = 0; v < q.size(); ++v) {
      if (!(q[v] >= 0.0f) || !std::isfinite(q[v])) {
        return InvalidArgumentError(StrCat("candidate tree distribution ", j, ": entry ", v, " is ",
                                           q[v], ", not a finite probability >= 0"));
      }
      total += q[v];
    }
  } else {
    if (ids.size() != q.size()) {
      return InvalidArgumentError(StrCat("candidate tree distribution ", j, ": ", ids.size(),
                                         " ids but ", q.size(), " probs (sparse: one per id)"));
    }
    for (size_t k = 0; k < ids.size(); ++k) {
      if (ids[k] < 0 || ids[k] >= vocab_size) {
        return InvalidArgumentError(StrCat("candidate tree distribution ", j, ": ids[", k,
                                           "] = ", ids[k], " is outside the vocabulary [0, ",
                                           vocab_size, ")"));
      }
      if (k > 0 && ids[k] <= ids[k - 1]) {
        return InvalidArgumentError(StrCat(
            "candidate tree distribution ", j, ": ids[", k, "] = ", ids[k], " does not follow ids[",
            k - 1, "] = ", ids[k - 1], " (ids must be strictly increasing)"));
      }
      if (!(q[k] >= 0.0f && q[k] <= 1.0f)) {
        return InvalidArgumentError(StrCat("candidate tree distribution ", j, ": probs[", k,
                                           "] is ", q[k], ", not a probability in [0, 1]"));
      }
      total += q[k];
    }
  }
  if (!(total > 0.0)) {
    return InvalidArgumentError(
        StrCat("candidate tree distribution ", j, ": probabilities sum to 0"));
  }
  return OkStatus();
}

Status CandidateTree::Validate(int32_t vocab_size, int32_t max_nodes, int32_t max_depth) const {
  RETURN_IF_ERROR(failure_);
  if (size() > max_nodes) {
    return InvalidArgumentError(
        StrCat("candidate tree has ", size(), " nodes, over the budget of ", max_nodes));
  }
  for (int32_t j = 0; j < num_distributions(); ++j) {
    RETURN_IF_ERROR(ValidateDistribution(j, vocab_size));
  }
  for (int32_t i = 0; i < size(); ++i) {
    const int32_t parent = parents_[i];
    if (parent < -1 || parent >= i) {
      return InvalidArgumentError(
          StrCat("candidate tree node ", i, ": parent ", parent, " does not precede it"));
    }
    const int32_t token = tokens_[i];
    if (token < 0 || token >= vocab_size) {
      return InvalidArgumentError(StrCat("candidate tree node ", i, ": token ", token,
                                         " is outside the vocabulary [0, ", vocab_size, ")"));
    }
    if (depths_[i] > max_depth) {
      return InvalidArgumentError(StrCat("candidate tree node ", i, ": depth ", depths_[i],
                                         " exceeds the maximum depth ", max_depth));
    }
    const float prob = draft_probs_[i];
    if (!(prob >= 0.0f && prob <= 1.0f)) {
      return InvalidArgumentError(
          StrCat("candidate tree node ", i, ": draft_prob ", prob, " is outside [0, 1]"));
    }
    const int32_t proposal = proposals_[i];
    if (proposal < -1 || proposal >= num_distributions()) {
      return InvalidArgumentError(StrCat("candidate tree node ", i, ": proposal ", proposal,
                                         " is not -1 (deterministic) or one of the ",
                                         num_distributions(), " distributions"));
    }
    if (proposal >= 0 && !(ProposalProbability(proposal, token) > 0.0f)) {
      return InvalidArgumentError(StrCat("candidate tree node ", i, ": token ", token,
                                         " was sampled from distribution ", proposal,
                                         ", which gives it probability 0"));
    }
  }
  return OkStatus();
}

}  // namespace specula
