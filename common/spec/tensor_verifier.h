// Lossless verification of a whole step's candidate trees where the target's logits are (the
// device on GPU builds, the host on CPU), as batched tensor ops instead of per-node host loops:
//   - greedy sequences: one argmax per logits row on the tensor's device, and one int32 per row
//     copied back; the tree walk on the host then only compares token ids.
//   - sampled sequences: the request's distribution (temperature, top-k, top-p, exactly as
//     Probabilities() shapes it) for every row at once, then recursive rejection sampling over
//     every sequence's tree in lockstep (one pass per tree level, one per sibling), and one copy
//     of the accepted paths and bonus tokens back to the host.
// The host verifier (verifier.h) stays the oracle: greedy results are identical, sampled results
// have the same distribution (chi-square tests). Lossy rules (SpecDec, typical) run on the host.
//
// Random numbers: a sampled sequence draws tree.size() + 1 uniforms from its SequenceRng up front
// (one per node for its acceptance test, in node order, and one for the bonus token), whatever
// the outcome, so a seed reproduces the same tokens for the same trees; the host verifier draws
// them lazily, so the two consume the stream differently (same distribution, other tokens).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <span>
#include <vector>

#include "common/sampling/sampler.h"
#include "common/spec/candidate_tree.h"
#include "common/spec/verifier.h"
#include "common/util/status.h"

namespace specula {

// One sequence's share of a step's logits: row `first_row` is the pending token's (it predicts
// the children of the root), row first_row + 1 + i is tree node i's.
struct TreeVerifyJob {
  const CandidateTree* tree = nullptr;
  int64_t first_row = 0;
  SamplingParams sampling;
  SequenceRng* rng = nullptr;  // used by sampled jobs only
};

// Verifies every job against `logits` ([rows, vocab], float32, any device) with the lossless rule.
// One result per job: INVALID_ARGUMENT for that job alone when its tree, rows or sampling
// parameters are invalid (the other jobs still verify).
std::vector<StatusOr<VerifyResult>> VerifyTreesOnTensors(const at::Tensor& logits,
                                                         std::span<const TreeVerifyJob> jobs);

// The sampling distribution of each row as Probabilities() computes it per row, float32
// [rows, vocab] on the logits' device. temperature > 0 required;
// top_k 0 = off, top_p 1 = off; ties in top-k / top-p go to the lower token id. `temperature`,
// `top_k` and `top_p` hold one value per row.
at::Tensor ShapedProbabilities(const at::Tensor& logits, const std::vector<double>& temperature,
                               const std::vector<int64_t>& top_k, const std::vector<double>& top_p);

}  // namespace specula
