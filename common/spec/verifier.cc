#include "common/spec/verifier.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>

namespace specula {

Status VerifyParams::Validate() const {
  if (specdec_beta < 1) {
    return InvalidArgumentError(StrCat("specdec_beta must be >= 1, got ", specdec_beta));
  }
  if (!(specdec_tau >= 0.0f) || !std::isfinite(specdec_tau)) {
    return InvalidArgumentError(
        StrCat("specdec_tau must be a finite number >= 0, got ", specdec_tau));
  }
  if (!(typical_epsilon > 0.0f && typical_epsilon <= 1.0f)) {
    return InvalidArgumentError(StrCat("typical_epsilon must be in (0, 1], got ", typical_epsilon));
  }
  if (!(typical_delta > 0.0f) || !std::isfinite(typical_delta)) {
    return InvalidArgumentError(
        StrCat("typical_delta must be a finite number > 0, got ", typical_delta));
  }
  return OkStatus();
}

const char* VerifyModeName(VerifyMode mode) {
  switch (mode) {
    case VerifyMode::kLossless:
      return "lossless";
    case VerifyMode::kSpecDec:
      return "specdec";
    case VerifyMode::kTypical:
      return "typical";
  }
  return "unknown";
}

StatusOr<VerifyMode> ParseVerifyMode(const std::string& name) {
  if (name == "lossless" || name == "greedy" || name == "sample") return VerifyMode::kLossless;
  if (name == "specdec") return VerifyMode::kSpecDec;
  if (name == "typical") return VerifyMode::kTypical;
  return InvalidArgumentError(StrCat("unknown verify mode '", name,
                                     "' (valid: lossless, greedy, sample, specdec, typical)"));
}

namespace {

// children[node + 1]: the children of `node` (-1 = the pending token) in insertion order.
std::vector<std::vector<int32_t>> ChildLists(const CandidateTree& tree) {
  std::vector<std::vector<int32_t>> children(tree.size() + 1);
  for (int32_t i = 0; i < tree.size(); ++i) children[tree.parent(i) + 1].push_back(i);
  return children;
}

// The row of logits that predicts the children of `node`.
std::span<const float> RowOf(const TreeLogits& logits, int32_t node) {
  return logits.row(node + 1);
}

// The request's own choice at a row: argmax for greedy requests, else a draw from Probabilities.
int32_t TargetToken(std::span<const float> row, const SamplingParams& sampling, SequenceRng& rng) {
  if (sampling.greedy()) return Argmax(row);
  const std::vector<float> probs = Probabilities(row, sampling);
  return SampleFrom(probs, rng);
}

// Greedy requests: follow the target's argmax through the tree. Consumes no random numbers.
VerifyResult VerifyGreedy(const CandidateTree& tree, const TreeLogits& logits,
                          const std::vector<std::vector<int32_t>>& children) {
  VerifyResult result;
  int32_t node = -1;
  while (true) {
    const int32_t best = Argmax(RowOf(logits, node));
    int32_t next = -1;
    for (int32_t child : children[node + 1]) {
      if (tree.token(child) == best) {
        next = child;
        break;
      }
    }
    if (next < 0) {
      result.bonus_token = best;
      return result;
    }
    result.accepted_nodes.push_back(next);
    node = next;
  }
}

// Scales `v` to sum 1; returns false (leaving `v` alone) when its sum is not positive.
bool Normalize(std::vector<double>& v) {
  const double total = std::accumulate(v.begin(), v.end(), 0.0);
  if (!(total > 0.0) || !std::isfinite(total)) return false;
  const double inv = 1.0 / total;
  for (double& x : v) x *= inv;
  return true;
}

// A proposal distribution normalised to sum 1: dense ([vocab]) or sparse (a value per id of the
// tree's distribution_ids, strictly increasing).
struct NormalisedProposal {
  std::span<const int32_t> ids;  // empty = dense
  std::vector<double> probs;

  double At(int32_t token) const {
    if (ids.empty()) return probs[token];
    const auto it = std::lower_bound(ids.begin(), ids.end(), token);
    return it != ids.end() && *it == token ? probs[static_cast<size_t>(it - ids.begin())] : 0.0;
  }
};

// r = max(0, r - q) renormalised, touching only q's support when q is sparse. The sum runs over
// every token in id order whatever q's form, so a sparse q and the same q stored densely give
// bit-identical residuals (and the same draws from one random stream).
void SubtractProposal(std::vector<double>& r, const NormalisedProposal& q) {
  double total = 0.0;
  if (q.ids.empty()) {
    for (size_t v = 0; v < r.size(); ++v) total += std::max(0.0, r[v] - q.probs[v]);
  } else {
    size_t k = 0;
    for (size_t v = 0; v < r.size(); ++v) {
      if (k < q.ids.size() && static_cast<size_t>(q.ids[k]) == v) {
        total += std::max(0.0, r[v] - q.probs[k++]);
      } else {
        total += r[v];
      }
    }
  }
  // A zero residual cannot happen with exact arithmetic (a rejection implies r != q); with
  // rounding, keep r.
  if (!(total > 0.0) || !std::isfinite(total)) return;
  const double inv = 1.0 / total;
  if (q.ids.empty()) {
    for (size_t v = 0; v < r.size(); ++v) r[v] = std::max(0.0, r[v] - q.probs[v]) * inv;
  } else {
    for (size_t k = 0; k < q.ids.size(); ++k) r[q.ids[k]] = std::max(0.0, r[q.ids[k]] - q.probs[k]);
    for (double& x : r) x *= inv;
  }
}

// Sampled requests, lossless: recursive rejection sampling over each node's children.
//
// r starts as the target's distribution at the node (exactly as plain sampling shapes it). Each
// child is a candidate x drawn independently from its proposal q (a point mass for deterministic
// children) and is accepted with probability min(1, r[x] / q[x]); on rejection r becomes
// max(0, r - q) renormalised. If every child is rejected the bonus token is drawn from the final r.
// By induction over the children, the token that leaves the node (accepted child or bonus) has
// distribution r exactly, so the output has the distribution of plain sampling (SpecInfer's
// multi-candidate rule; for a chain it is Leviathan et al.'s). A sparse q (top-k truncated) is an
// exact proposal like any other: q is 0 off its support, so the residual changes only there.
VerifyResult VerifySampled(const CandidateTree& tree, const TreeLogits& logits,
                           const std::vector<std::vector<int32_t>>& children,
                           const SamplingParams& sampling, SequenceRng& rng) {
  VerifyResult result;
  // Proposal distributions normalised to sum 1, computed on first use.
  std::vector<std::optional<NormalisedProposal>> proposals(tree.num_distributions());
  auto proposal = [&](int32_t j) -> const NormalisedProposal& {
    if (!proposals[j]) {
      const std::span<const float> q = tree.distribution(j);
      NormalisedProposal normalised{.ids = tree.distribution_ids(j),
                                    .probs = std::vector<double>(q.begin(), q.end())};
      Normalize(normalised.probs);  // Validate guarantees a positive total for every distribution
      proposals[j] = std::move(normalised);
    }
    return *proposals[j];
  };

  int32_t node = -1;
  std::vector<double> r;
  while (true) {
    const std::vector<float> probs = Probabilities(RowOf(logits, node), sampling);
    const std::vector<int32_t>& kids = children[node + 1];
    if (kids.empty()) {
      result.bonus_token = SampleFrom(probs, rng);
      return result;
    }
    r.assign(probs.begin(), probs.end());
    Normalize(r);
    int32_t accepted = -1;
    for (int32_t child : kids) {
      const int32_t x = tree.token(child);
      const int32_t j = tree.proposal(child);
      if (j < 0) {
        // Point mass at x: accept with probability r[x]; on rejection r[x] = 0.
        if (r[x] <= 0.0) continue;
        if (r[x] >= 1.0 || rng.Uniform() < r[x]) {
          accepted = child;
          break;
        }
        const double kept = r[x];
        r[x] = 0.0;
        if (!Normalize(r)) r[x] = kept;  // cannot happen: r[x] < 1 leaves mass elsewhere
      } else {
        const NormalisedProposal& q = proposal(j);
        const double qx = q.At(x);  // > 0: Validate checks the sampled token is in q's support
        // Accept with probability min(1, r[x] / q[x]).
        if (r[x] >= qx || rng.Uniform() * qx < r[x]) {
          accepted = child;
          break;
        }
        SubtractProposal(r, q);
      }
    }
    if (accepted < 0) {
      const std::vector<float> residual(r.begin(), r.end());
      result.bonus_token = SampleFrom(residual, rng);
      return result;
    }
    result.accepted_nodes.push_back(accepted);
    node = accepted;
  }
}

// LOSSY. SpecDec's relaxed rule: accept the first child x that ranks among the top beta of the
// request's distribution and whose log-probability is within tau of that distribution's top-1.
// The paper defines it for greedy decoding on the model's log-probabilities; we keep that for
// greedy requests (the raw logits: log_softmax shifts them all by one constant) and define it for
// sampled requests on the distribution the request samples from (Probabilities: temperature, top-k,
// top-p), so tau is a gap in shaped log-probability (logit gap / temperature) and a token the
// shaping removed is never accepted. Ranks break ties towards the lower id, as Argmax and top-k
// do, so beta = 1 accepts only the greedy (resp. the shaped mode) token. The replacement after a
// failure is the request's own choice (argmax, or a draw from the shaped distribution).
VerifyResult VerifySpecDec(const CandidateTree& tree, const TreeLogits& logits,
                           const std::vector<std::vector<int32_t>>& children,
                           const SamplingParams& sampling, const VerifyParams& params,
                           SequenceRng& rng) {
  VerifyResult result;
  int32_t node = -1;
  std::vector<float> shaped;
  while (true) {
    const std::span<const float> raw = RowOf(logits, node);
    // Scores in which the rule is evaluated: raw logits (greedy) or shaped probabilities.
    std::span<const float> score = raw;
    if (!sampling.greedy()) {
      shaped = Probabilities(raw, sampling);
      score = shaped;
    }
    const double top = score[Argmax(score)];
    int32_t next = -1;
    for (int32_t child : children[node + 1]) {
      const int32_t x = tree.token(child);
      const float sx = score[x];
      const double gap = sampling.greedy() ? top - sx : std::log(top) - std::log(sx);
      if (!(sampling.greedy() || sx > 0.0f) || !(gap <= params.specdec_tau)) continue;
      // x's rank: the tokens ordered before it.
      int64_t ahead = 0;
      for (int32_t v = 0; v < static_cast<int32_t>(score.size()); ++v) {
        ahead += (score[v] > sx || (score[v] == sx && v < x)) ? 1 : 0;
      }
      if (ahead < params.specdec_beta) {
        next = child;
        break;
      }
    }
    if (next < 0) {
      result.bonus_token = sampling.greedy() ? Argmax(raw) : SampleFrom(shaped, rng);
      return result;
    }
    result.accepted_nodes.push_back(next);
    node = next;
  }
}

// LOSSY. Medusa's typical acceptance: p = softmax(logits / temperature); accept the first child
// with p[x] > min(epsilon, delta * exp(-H(p))). Only for sampled requests (greedy ones use the
// lossless greedy rule).
VerifyResult VerifyTypical(const CandidateTree& tree, const TreeLogits& logits,
                           const std::vector<std::vector<int32_t>>& children,
                           const SamplingParams& sampling, const VerifyParams& params,
                           SequenceRng& rng) {
  VerifyResult result;
  const double inv_t = 1.0 / sampling.temperature;
  int32_t node = -1;
  std::vector<double> p;
  while (true) {
    const std::span<const float> row = RowOf(logits, node);
    const std::vector<int32_t>& kids = children[node + 1];
    int32_t next = -1;
    if (!kids.empty()) {
      const double max_logit = row[Argmax(row)];
      p.resize(row.size());
      double total = 0.0;
      for (size_t v = 0; v < row.size(); ++v) {
        p[v] = std::exp((row[v] - max_logit) * inv_t);
        total += p[v];
      }
      double entropy = 0.0;
      for (double& pv : p) {
        pv /= total;
        if (pv > 0.0) entropy -= pv * std::log(pv);
      }
      const double threshold =
          std::min<double>(params.typical_epsilon, params.typical_delta * std::exp(-entropy));
      for (int32_t child : kids) {
        if (p[tree.token(child)] > threshold) {
          next = child;
          break;
        }
      }
    }
    if (next < 0) {
      result.bonus_token = TargetToken(row, sampling, rng);
      return result;
    }
    result.accepted_nodes.push_back(next);
    node = next;
  }
}

Status ValidateInputs(const CandidateTree& tree, const TreeLogits& logits,
                      const SamplingParams& sampling, const VerifyParams& params) {
  if (logits.vocab <= 0 || logits.vocab > std::numeric_limits<int32_t>::max()) {
    return InvalidArgumentError(
        StrCat("logits vocabulary size must be in [1, 2^31), got ", logits.vocab));
  }
  constexpr int32_t kUnlimited = std::numeric_limits<int32_t>::max();
  RETURN_IF_ERROR(tree.Validate(static_cast<int32_t>(logits.vocab), kUnlimited, kUnlimited));
  if (logits.rows != static_cast<int64_t>(tree.size()) + 1) {
    return InvalidArgumentError(StrCat("logits have ", logits.rows,
                                       " rows, expected one per tree node plus one (",
                                       tree.size() + 1, ")"));
  }
  if (logits.data == nullptr) return InvalidArgumentError("logits data is null");
  RETURN_IF_ERROR(params.Validate());
  RETURN_IF_ERROR(sampling.Validate());
  return OkStatus();
}

}  // namespace

StatusOr<VerifyResult> VerifyTree(const CandidateTree& tree, const TreeLogits& logits,
                                  const SamplingParams& sampling, const VerifyParams& params,
                                  SequenceRng& rng) {
  RETURN_IF_ERROR(ValidateInputs(tree, logits, sampling, params));
  const std::vector<std::vector<int32_t>> children = ChildLists(tree);
  switch (params.mode) {
    case VerifyMode::kLossless:
      if (sampling.greedy()) return VerifyGreedy(tree, logits, children);
      return VerifySampled(tree, logits, children, sampling, rng);
    case VerifyMode::kSpecDec:
      return VerifySpecDec(tree, logits, children, sampling, params, rng);
    case VerifyMode::kTypical:
      // Temperature 0: p is a point mass at the argmax, so only the argmax child passes.
      if (sampling.greedy()) return VerifyGreedy(tree, logits, children);
      return VerifyTypical(tree, logits, children, sampling, params, rng);
  }
  return InvalidArgumentError(StrCat("unknown verify mode ", static_cast<int>(params.mode)));
}

}  // namespace specula
