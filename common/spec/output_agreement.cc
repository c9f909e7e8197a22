#include "common/spec/output_agreement.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>

namespace specula {

std::optional<int64_t> FirstDivergence(const std::vector<int32_t>& a,
                                       const std::vector<int32_t>& b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  }
  if (a.size() == b.size()) return std::nullopt;
  return static_cast<int64_t>(n);
}

namespace {

using NGram = std::vector<int32_t>;

std::map<NGram, int64_t> NGramCounts(const std::vector<int32_t>& tokens, size_t n) {
  std::map<NGram, int64_t> counts;
  for (size_t i = 0; i + n <= tokens.size(); ++i) {
    ++counts[NGram(tokens.begin() + i, tokens.begin() + i + n)];
  }
  return counts;
}

}  // namespace

double CorpusBleu4(const std::vector<std::vector<int32_t>>& candidates,
                   const std::vector<std::vector<int32_t>>& references) {
  std::array<int64_t, 4> matched{}, total{};
  int64_t candidate_length = 0, reference_length = 0;
  const size_t pairs = std::min(candidates.size(), references.size());
  for (size_t p = 0; p < pairs; ++p) {
    candidate_length += static_cast<int64_t>(candidates[p].size());
    reference_length += static_cast<int64_t>(references[p].size());
    for (size_t n = 1; n <= 4; ++n) {
      const auto cand = NGramCounts(candidates[p], n);
      const auto ref = NGramCounts(references[p], n);
      for (const auto& [gram, count] : cand) {
        total[n - 1] += count;
        const auto it = ref.find(gram);
        if (it != ref.end()) matched[n - 1] += std::min(count, it->second);
      }
    }
  }
  double log_precision = 0;
  for (size_t n = 0; n < 4; ++n) {
    if (matched[n] == 0 || total[n] == 0) return 0.0;
    log_precision += std::log(double(matched[n]) / double(total[n])) / 4.0;
  }
  const double brevity =
      candidate_length < reference_length ? 1.0 - double(reference_length) / candidate_length : 0.0;
  return 100.0 * std::exp(log_precision + brevity);
}

OutputAgreement CompareOutputs(const std::vector<std::vector<int32_t>>& outputs,
                               const std::vector<std::vector<int32_t>>& lossless) {
  OutputAgreement a;
  const size_t n = std::min(outputs.size(), lossless.size());
  a.requests = static_cast<int64_t>(n);
  double divergence_sum = 0;
  int64_t diverged = 0;
  for (size_t i = 0; i < n; ++i) {
    const std::optional<int64_t> d = FirstDivergence(outputs[i], lossless[i]);
    if (!d) {
      ++a.identical;
      continue;
    }
    divergence_sum += static_cast<double>(*d);
    ++diverged;
  }
  if (diverged > 0) a.mean_first_divergence = divergence_sum / static_cast<double>(diverged);
  a.bleu4 = CorpusBleu4(outputs, lossless);
  return a;
}

}  // namespace specula
