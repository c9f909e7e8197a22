// The tail of the gaps between streamed chunks, as the draft budget's latency bound needs it
// (DraftBudgetOptions::max_step_increase). Each planned step is a gap for every sequence that was
// already decoding when it started (a sequence whose prompt ends in the step gets its first token:
// time to first token, not a gap), so a step counts with that many gaps. Two numbers come from
// the last kWindow planned steps:
//   - plain_quantile(): the p99 gap the streams would see without drafts, each step's measured
//     wall less what the plan predicted its drafts would add (an undrafted step counts as
//     measured). Without drafts, each draft token a step accepted would have taken a step of
//     its own: they count as that many more gaps of a plain decode step (the step's own gap
//     without drafts, or for a step that also ran prompt chunks the last decode-only step's).
//     Otherwise drafting, by cutting the short steps, would lift its own reference: at
//     concurrency 16 the prompt steps beside the decodes are the p99, and n-gram accepting 1.27
//     tokens per step made them 26% of the steps instead of 22%, and its streams' p99 gap
//     1.14-1.16x `none`'s under a bound of 1.05;
//   - residual_quantile(): the p99.9 of each step's wall less its prediction: how much longer
//     than planned a step runs one time in a thousand (scheduling, the machine's other load).
// A drafted step planned at S seconds runs past S + residual_quantile() one time in a thousand;
// while S + residual_quantile() <= (1 + x) * plain_quantile(), drafted steps add at most a tenth
// of the 1% of gaps above that, and the streams' p99 gap stays within (1 + x) of plain_quantile()
// however many steps draft. (At the residual's p99, drafted steps could add 1% of their own
// gaps above it: where prefill steps beside the decodes set the p99 gap, decode steps planned
// just under it would lift it; n-gram at concurrency 4 in three processes read 1.4x the p99 of
// no speculation with that version, though no more than this VM's spread shows.) Where the
// gaps' tail is rare, long delays (a step at batch 1 on a shared machine: p99 2-5x the median),
// that lets a step grow by x times the p99 gap instead of x times itself; where it is the steps
// that prefill prompt chunks, decode steps with drafts may take up to about what those take less
// their worst overrun.
//
// Worked example: steps of 0.6 ms without drafts, one in fifty delayed 1 ms by the scheduler:
// plain_quantile() = 1.6 ms, residual_quantile() = 1.0 ms; with x = 0.05, a drafted step may be
// planned at 1.05 * 1.6 - 1.0 = 0.68 ms (0.63 ms by the step's own time alone).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace specula {

class StepGapTail {
 public:
  static constexpr int32_t kWindow = 1024;        // planned steps remembered
  static constexpr int32_t kReadyAfter = 256;     // steps with gaps before the quantiles are used
  static constexpr int32_t kRecomputeEvery = 32;  // steps between recomputing the quantiles
  static constexpr double kGapQuantile = 0.99;
  static constexpr double kResidualQuantile = 0.999;

  // A planned step: its measured wall, what the plan predicted for it and for the same step
  // without drafts, the sequences that waited for it (its gaps; 0: it counts for nothing), the
  // draft tokens they accepted, and whether it also ran prompt chunks.
  void Add(double wall, double predicted, double no_draft_predicted, int32_t gaps,
           int32_t accepted = 0, bool prompt_chunks = false);
  bool ready() const { return samples_.size() >= static_cast<size_t>(kReadyAfter); }
  // Both 0 until ready().
  double plain_quantile() const {
    Refresh();
    return plain_q_;
  }
  double residual_quantile() const {
    Refresh();
    return residual_q_;
  }

 private:
  struct Sample {
    double plain = 0;     // the gap without drafts
    double residual = 0;  // wall - predicted
    int32_t gaps = 0;
    double accepted_plain = 0;  // the plain decode step each accepted draft token stands for
    int32_t accepted = 0;
  };
  // The weighted q-quantile of the gaps without drafts, accepted tokens' steps included, or of
  // the residuals (scratch_ reused).
  double Quantile(bool plain, double q) const;
  void Refresh() const;

  std::vector<Sample> samples_;  // a ring of up to kWindow
  size_t next_ = 0;
  double last_decode_plain_ = 0;  // the last decode-only step's gap without drafts
  mutable int32_t stale_ = 0;     // samples since the quantiles were computed
  mutable bool computed_ = false;
  mutable double plain_q_ = 0, residual_q_ = 0;
  mutable std::vector<std::pair<double, int32_t>> scratch_;
};

}  // namespace specula
