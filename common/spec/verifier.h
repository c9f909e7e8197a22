// Verification of one sequence's candidate tree against the target's logits: which nodes are
// accepted and which token the target adds after them (the bonus token).
//
// Lossless modes reproduce the target exactly: greedy output equals plain greedy decoding, sampled
// output has the distribution of plain sampling with the same SamplingParams. The lossy modes
// (SpecDec's relaxed top-beta/tau rule, Medusa's typical acceptance) trade that for longer accepted
// runs; they are opt-in per request and reported as lossy everywhere. Torch-free.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/sampling/sampler.h"
#include "common/spec/candidate_tree.h"
#include "common/util/status.h"

namespace specula {

enum class VerifyMode {
  // Greedy requests: follow the target's argmax. Sampled requests: recursive rejection sampling
  // over each node's children (SpecInfer), which reduces to Leviathan et al.'s chain rule for a
  // chain.
  kLossless,
  // LOSSY. SpecDec (Xia et al.): a draft token is accepted if it is in the target's top-beta and
  // its log-probability is within tau of the top-1; the first failure is replaced by the target's
  // choice. Greedy requests: on the raw log-probabilities (the paper). Sampled requests: on the
  // distribution the request samples from (temperature, top-k, top-p applied), so tau is a gap in
  // shaped log-probability and tokens outside the shaped support are never accepted.
  kSpecDec,
  // LOSSY. Medusa's typical acceptance: accept a candidate when its target probability exceeds
  // min(epsilon, delta * exp(-entropy)).
  kTypical,
};

struct VerifyParams {
  VerifyMode mode = VerifyMode::kLossless;
  int32_t specdec_beta = 3;       // SpecDec top-beta (paper: 3)
  float specdec_tau = 1.0f;       // SpecDec log-likelihood gap (paper: 1.0)
  float typical_epsilon = 0.09f;  // Medusa's posterior threshold
  float typical_delta = 0.3f;     // Medusa's entropy-scaled threshold (sqrt of epsilon)

  bool lossy() const { return mode != VerifyMode::kLossless; }
  // INVALID_ARGUMENT naming the field.
  Status Validate() const;
};

// "lossless", "specdec", "typical".
const char* VerifyModeName(VerifyMode mode);
// Also accepts "greedy" and "sample" (both lossless).
StatusOr<VerifyMode> ParseVerifyMode(const std::string& name);

// The target's logits for one sequence's verification forward: row 0 at the pending token (it
// predicts the children of the root), row i + 1 at tree node i. Rows are float32 [vocab].
struct TreeLogits {
  const float* data = nullptr;
  int64_t rows = 0;
  int64_t vocab = 0;
  std::span<const float> row(int64_t r) const {
    return {data + r * vocab, static_cast<size_t>(vocab)};
  }
};

struct VerifyResult {
  std::vector<int32_t> accepted_nodes;  // a root-to-node path of tree node indices
  int32_t bonus_token = -1;             // the target's token after the accepted path
};

// Validates the tree against the logits (vocab, one row per node + 1) and verifies it. Consumes
// random numbers from `rng` only for sampled requests.
StatusOr<VerifyResult> VerifyTree(const CandidateTree& tree, const TreeLogits& logits,
                                  const SamplingParams& sampling, const VerifyParams& params,
                                  SequenceRng& rng);

}  // namespace specula
