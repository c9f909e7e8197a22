// How far a lossy verification rule moves the output: compares each request's tokens with the
// lossless output for the same prompt (SpecDec's "relative BLEU" and friends). Torch-free.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace specula {

// Index of the first position where `a` and `b` differ; when one is a prefix of the other, the
// shorter length; nullopt when they are identical.
std::optional<int64_t> FirstDivergence(const std::vector<int32_t>& a,
                                       const std::vector<int32_t>& b);

// Corpus-level BLEU-4 (Papineni et al.) on token ids, in [0, 100]: clipped 1..4-gram precisions
// summed over all pairs, their geometric mean, times the brevity penalty exp(1 - r / c) when the
// candidates are shorter in total (c < r). No smoothing: 0 when some order has no match. 100 when
// every candidate equals its reference (and some candidate has 4 tokens).
// `candidates` and `references` pair up by index; sizes must match.
double CorpusBleu4(const std::vector<std::vector<int32_t>>& candidates,
                   const std::vector<std::vector<int32_t>>& references);

struct OutputAgreement {
  int64_t requests = 0;
  int64_t identical = 0;  // outputs equal to the lossless one, token for token
  // Mean first-divergence position over the requests that diverge (nullopt when none does).
  std::optional<double> mean_first_divergence;
  double bleu4 = 0;  // CorpusBleu4(outputs, lossless)
  double identical_share() const { return requests ? double(identical) / requests : 0; }
};

// `outputs[i]` against `lossless[i]`; the sizes must match (checked by the caller).
OutputAgreement CompareOutputs(const std::vector<std::vector<int32_t>>& outputs,
                               const std::vector<std::vector<int32_t>>& lossless);

}  // namespace specula
