#include "common/spec/proposal.h"

#include <algorithm>
#include <numeric>
#include <utility>

namespace specula {

Proposal TopKProposal(std::vector<float> probs, int32_t k) {
  Proposal q;
  if (k <= 0) {
    q.probs = std::move(probs);
    return q;
  }
  std::vector<int32_t> order;
  order.reserve(probs.size());
  for (size_t v = 0; v < probs.size(); ++v) {
    if (probs[v] > 0.0f) order.push_back(static_cast<int32_t>(v));
  }
  // Keeping every token (dense is as small), or none (no distribution: Validate reports it).
  if ((static_cast<size_t>(k) >= probs.size() && order.size() == probs.size()) || order.empty()) {
    q.probs = std::move(probs);
    return q;
  }
  if (order.size() > static_cast<size_t>(k)) {
    // Most probable first, ties to the lower id; only the first k matter.
    const auto before = [&](int32_t a, int32_t b) {
      return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
    };
    std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), before);
    order.resize(static_cast<size_t>(k));
    std::sort(order.begin(), order.end());
  }
  double total = 0.0;
  for (int32_t v : order) total += probs[v];
  q.ids = std::move(order);
  q.probs.reserve(q.ids.size());
  for (int32_t v : q.ids) q.probs.push_back(static_cast<float>(probs[v] / total));
  return q;
}

int32_t SampleProposal(const Proposal& q, SequenceRng& rng) {
  const int32_t index = SampleFrom(q.probs, rng);
  return q.dense() ? index : q.ids[static_cast<size_t>(index)];
}

float ProposalProbability(const Proposal& q, int32_t token) {
  if (q.dense()) {
    return token >= 0 && static_cast<size_t>(token) < q.probs.size() ? q.probs[token] : 0.0f;
  }
  const auto it = std::lower_bound(q.ids.begin(), q.ids.end(), token);
  if (it == q.ids.end() || *it != token) return 0.0f;
  return q.probs[static_cast<size_t>(it - q.ids.begin())];
}

int32_t AddProposal(CandidateTree& tree, Proposal q) {
  if (q.dense()) return tree.AddDistribution(std::move(q.probs));
  return tree.AddSparseDistribution(std::move(q.ids), std::move(q.probs));
}

int32_t AddSampledNode(CandidateTree& tree, int32_t parent, std::vector<float> probs, int32_t k,
                       SequenceRng& rng) {
  Proposal q = TopKProposal(std::move(probs), k);
  const int32_t token = SampleProposal(q, rng);
  const float p = ProposalProbability(q, token);
  const int32_t j = AddProposal(tree, std::move(q));
  return tree.AddNode(parent, token, p, j);
}

}  // namespace specula
