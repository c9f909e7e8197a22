#include "common/drafters/marginal_drafts.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <queue>

#include "common/drafters/draft_sampling.h"
#include "common/spec/proposal.h"
#include "common/util/mapped_file.h"

namespace specula {

int32_t AddChainNode(CandidateTree& tree, int32_t parent, std::span<const float> row,
                     const SamplingParams& sampling, SequenceRng& rng, int32_t proposal_top_k) {
  if (sampling.greedy()) {
    const TopToken top = ArgmaxWithProbability(row);
    tree.AddNode(parent, top.token, top.prob);
    return top.token;
  }
  const int32_t node =
      AddSampledNode(tree, parent, Probabilities(row, sampling), proposal_top_k, rng);
  return tree.token(node);
}

CandidateTree DraftMarginalChain(const DepthLogits& rows, int32_t depth,
                                 const SamplingParams& sampling, SequenceRng& rng,
                                 int32_t proposal_top_k) {
  CandidateTree tree;
  for (int32_t j = 0; j < depth; ++j) {
    AddChainNode(tree, j - 1, rows.Row(j), sampling, rng, proposal_top_k);
  }
  return tree;
}

CandidateTree DraftMarginalTree(const DepthLogits& rows, int32_t depth, int32_t budget,
                                const SamplingParams& sampling) {
  CandidateTree tree;
  if (depth <= 0 || budget <= 0) return tree;
  // Per depth: probabilities and the tokens sorted by them (at most `budget` are ever used).
  std::vector<std::vector<float>> probs(depth);
  std::vector<std::vector<int32_t>> ranked(depth);
  for (int32_t j = 0; j < depth; ++j) {
    probs[j] = DraftProbabilities(rows.Row(j), sampling);
    ranked[j] = TopTokens(probs[j], budget);
    // Shaped distributions (top-k / top-p) give many tokens probability 0: never draft those.
    while (!ranked[j].empty() && probs[j][ranked[j].back()] <= 0.0f) ranked[j].pop_back();
  }
  struct Candidate {
    double path_prob;
    int64_t order;   // discovery order (tie-break)
    int32_t parent;  // node index, -1 = the pending token
    int32_t depth;   // 0-based row
    int32_t rank;    // index into ranked[depth]
    double parent_prob;
  };
  auto worse = [](const Candidate& a, const Candidate& b) {
    return a.path_prob < b.path_prob || (a.path_prob == b.path_prob && a.order > b.order);
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(worse)> heap(worse);
  int64_t order = 0;
  auto push = [&](int32_t parent, int32_t d, int32_t rank, double parent_prob) {
    if (d >= depth || rank >= static_cast<int32_t>(ranked[d].size())) return;
    const double p = probs[d][ranked[d][rank]];
    heap.push({parent_prob * p, order++, parent, d, rank, parent_prob});
  };
  push(-1, 0, 0, 1.0);
  while (!heap.empty() && tree.size() < budget) {
    const Candidate c = heap.top();
    heap.pop();
    const int32_t token = ranked[c.depth][c.rank];
    const int32_t node = tree.AddNode(c.parent, token, probs[c.depth][token]);
    push(c.parent, c.depth, c.rank + 1, c.parent_prob);  // next sibling
    push(node, c.depth + 1, 0, c.path_prob);             // best child
  }
  return tree;
}

StatusOr<StaticDraftTree> StaticDraftTree::FromFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return FromJson(text, path);
}

StatusOr<StaticDraftTree> StaticDraftTree::FromJson(std::string_view text,
                                                    std::string_view source) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgumentError(StrCat(source, ": not valid JSON"));
  if (j.is_object() && j.contains("paths")) j = j["paths"];
  if (!j.is_array() || j.empty()) {
    return InvalidArgumentError(
        StrCat(source, ": a static tree is a non-empty array of rank paths ([[0], [1], [0, 0]])"));
  }
  std::vector<std::vector<int32_t>> paths;
  for (size_t p = 0; p < j.size(); ++p) {
    const auto& path = j[p];
    if (!path.is_array() || path.empty()) {
      return InvalidArgumentError(StrCat(source, ": path ", p, " is not a non-empty array"));
    }
    std::vector<int32_t> ranks;
    for (const auto& r : path) {
      if (!r.is_number_integer() || r.get<int64_t>() < 0 || r.get<int64_t>() > (1 << 20)) {
        return InvalidArgumentError(
            StrCat(source, ": path ", p, " holds ", r.dump(), ", expected a rank >= 0"));
      }
      ranks.push_back(r.get<int32_t>());
    }
    paths.push_back(std::move(ranks));
  }
  std::stable_sort(paths.begin(), paths.end(),
                   [](const auto& a, const auto& b) { return a.size() < b.size(); });
  StaticDraftTree tree;
  std::map<std::vector<int32_t>, int32_t> index;
  for (const auto& path : paths) {
    std::string name = "[";
    for (size_t i = 0; i < path.size(); ++i) name += StrCat(i ? ", " : "", path[i]);
    name += "]";
    if (index.count(path)) return InvalidArgumentError(StrCat(source, ": path ", name, " repeats"));
    int32_t parent = -1;
    if (path.size() > 1) {
      auto it = index.find(std::vector<int32_t>(path.begin(), path.end() - 1));
      if (it == index.end()) {
        return InvalidArgumentError(StrCat(source, ": path ", name, " has no parent path"));
      }
      parent = it->second;
    }
    index[path] = static_cast<int32_t>(tree.paths_.size());
    tree.paths_.push_back(path);
    tree.parent_.push_back(parent);
    tree.max_depth_ = std::max<int32_t>(tree.max_depth_, static_cast<int32_t>(path.size()));
    for (int32_t r : path) tree.max_rank_ = std::max(tree.max_rank_, r);
  }
  return tree;
}

CandidateTree StaticDraftTree::Draft(const DepthLogits& rows, int32_t depth, int32_t budget,
                                     const SamplingParams& sampling) const {
  CandidateTree tree;
  depth = std::min(depth, max_depth_);
  if (depth <= 0 || budget <= 0) return tree;
  std::vector<std::vector<float>> probs(depth);
  std::vector<std::vector<int32_t>> ranked(depth);
  for (int32_t j = 0; j < depth; ++j) {
    probs[j] = DraftProbabilities(rows.Row(j), sampling);
    ranked[j] = TopTokens(probs[j], max_rank_ + 1);
  }
  std::vector<int32_t> node(paths_.size(), -1);  // path -> tree node (-1: not drafted)
  for (size_t p = 0; p < paths_.size() && tree.size() < budget; ++p) {
    const int32_t d = static_cast<int32_t>(paths_[p].size()) - 1;
    if (d >= depth) break;  // sorted by length: every later path is as deep
    const int32_t parent = parent_[p] < 0 ? -1 : node[parent_[p]];
    if (parent_[p] >= 0 && parent < 0) continue;  // its parent was left out
    const int32_t rank = paths_[p].back();
    if (rank >= static_cast<int32_t>(ranked[d].size())) continue;
    const int32_t token = ranked[d][rank];
    if (probs[d][token] <= 0.0f) continue;
    node[p] = tree.AddNode(parent, token, probs[d][token]);
  }
  return tree;
}

}  // namespace specula
