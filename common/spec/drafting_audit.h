// The adaptive draft budget's audit: whether drafting, as the policy runs it, makes the engine
// faster than not drafting at all, measured end to end rather than predicted. Torch-free.
//
// The policy (draft_budget.h) prices each draft against models of the step with and without it,
// fitted from measured steps. What the models cannot see stays unseen: a cost that lands on
// steps the policy does not attribute to drafting (on the CPU at batch 1 the steps between
// hidden-state drafts run 1-9% slower than the steps of a run that never drafts: the drafter's
// weights and states crowd the target's out of the shared cache), a shape the fit prices wrongly,
// a drafter whose cost depends on something the fit has no feature for (a remote drafter's
// network). Users are promised never to be slower than no speculation, so the promise is checked
// end to end: the audit alternates epochs in which the policy plans as usual (drafting epochs)
// with epochs in which nobody drafts (no-draft epochs), compares their tokens per second, and
// keeps drafting only while it does not lose. Its estimate is also what an operator wants to
// see (specula_draft_budget_realized_speedup): is speculation paying right now?
//
// Measured: each decode-only step that could have drafted (some sequence had a drafter and room)
// is one sample: its wall seconds, the tokens it committed, and `norm_seconds`, what the step
// without drafts would take by the step cost fit's prices as they stood when the pair of epochs
// began (frozen, so that the fit, which learns from both kinds of epoch, cannot carry one's
// slowness into the other's yardstick; a batch that changes size between epochs does not read
// as a speedup). A run of samples' rate is sum(norm_seconds x tokens / decoding) / sum(seconds):
// 1 for steps that run as the yardstick predicts without drafts, 1.2 where drafting yields 20%
// more tokens per second. Steps with prompt chunks are not samples (the chunk, not the drafts,
// sets their time); a step's time counts at most kOutlierFactor times its yardstick.
//
// A pair of epochs compares a short epoch with the long epoch's `window_steps` samples just before
// it and just after it: on a shared machine the speed drifts by tens of percent over seconds
// (other tenants), so a short epoch compared with a whole long one measures the drift (the no-draft
// epochs of one run took 0.42-0.65 ms a step); windows on both sides cancel drift that is linear
// over the pair. The first `flush_steps` after drafting stops count as drafting (the caches its
// drafts evicted refill over ~10 steps: that is drafting's cost).
//
// Decision: after each pair, its realized speedup (drafting's rate over the no-draft rate) is
// averaged into an estimate (in logs: the mean of the pairs so far, then `estimate_rate` per
// pair). Unknown for the first two pairs, the verdict becomes "pays" where the estimate exceeds
// `resume_above` and "does not pay" below it; then it flips to "does not pay" when the estimate
// falls below `stop_below` (the floor users are promised, 0.97), and back to "pays" above
// `resume_above`. The verdict's own mode runs in long epochs, the other in short ones: while
// drafting pays (or before a verdict), a no-draft check of `check_steps` (flush included); while
// it does not, a drafting trial of `trial_steps`. A long epoch lasts as long as keeps its short
// epochs' cost within `check_cost` of the throughput at the estimate (within `min_long_steps`
// and `max_long_steps`; `min_long_steps` before a verdict), and ends early after
// `max_long_seconds` of measured steps, so that a change of load is seen within seconds, but not
// before `long_over_short` times its short epoch's steps: 64 check steps at no speculation's rate
// where drafting pays 1.2x cost 0.5% of the throughput with 2,070-step epochs; at 12 ms a step
// (batch 64 on the CPU) 2 s are 166 steps, and checks every 166 would have cost 4.6% (a losing
// drafter's trials, 45% of the steps), so there the epochs last 1,024 steps (2,304 in the
// no-draft mode): short epochs take at most 1/17 of the steps, and a verdict turns in about a
// minute instead of seconds (the policy's own models follow load within steps; the audit is the
// backstop).
//
// What it can tell apart: a pair is a few hundred steps, and per step the time varies by ~36%
// (context length, the steps after a draft, the machine) and a drafter's yield with the text; on
// the 2-vCPU VM of the thirty-sixth session pairs of one drafter at batch 1 read 0.76-1.59. The
// estimate (~7 pairs) then resolves a loss of ~10% within a few pairs, not one of 1-3%: those are
// the policy's own accounting to get right, and the audit's thresholds sit where noise rarely
// stops a paying drafter (n-gram at 1.13x: the estimate's spread is ~8%).
//
// Worked example (batch 1, yardstick 0.40 ms): the 128 drafting steps before a check took 47.0
// ms for 165 tokens (rate 165 x 0.40 / 47.0 = 1.404), the 16 flush steps 6.9 ms for 16 (0.928,
// counted with them: 181 x 0.40 / 53.9 = 1.343), the 48 no-draft steps 20.0 ms for 48 (0.960),
// and the 128 drafting steps after it 48.5 ms for 160 (1.320): drafting's rate 341 x 0.40 /
// 102.4 = 1.332, realized speedup 1.332 / 0.960 = 1.39: drafting pays. A drafter whose steps
// between drafts run 10% slower than no-draft steps while its drafts gain 3% reads ~0.94, and
// stops.
//
// One audit per set of drafters in the batch (DraftBudgetPolicy keys them by the drafters its
// candidates use): what one drafter's epochs measured says nothing of another's, and a server
// whose requests move from one drafter to another would otherwise start each under the last
// one's verdict. Not one per batch size: a change of batch size moves the yardstick, and epochs
// of different sizes next to each other share their caches' state (a no-draft epoch of one size
// after drafts of another measures the other's eviction). Where the policy drafts nothing
// anyway, both epochs measure the same thing and the verdict costs nothing either way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace specula {

struct DraftingAuditOptions {
  bool enabled = true;
  int32_t trial_steps = 128;   // a drafting epoch while drafting does not pay
  int32_t check_steps = 64;    // a no-draft epoch while it pays (or before a verdict)
  int32_t flush_steps = 16;    // the steps after drafting stops, counted as drafting
  int32_t window_steps = 128;  // the long epoch's samples compared, on each side of a short one
  int32_t min_long_steps = 256;
  int32_t max_long_steps = 4096;
  double max_long_seconds = 2.0;
  // A long epoch ended by max_long_seconds still lasts this many times its short epoch's steps.
  int32_t long_over_short = 16;
  // The long epochs are made long enough that the short ones cost at most this share of the
  // throughput at the estimated speedup (within min_long_steps and max_long_steps).
  double check_cost = 0.005;
  double stop_below = 0.97;     // "pays" becomes "does not pay" below this realized speedup
  double resume_above = 1.02;   // and back above this one (and a first verdict is "pays")
  double estimate_rate = 0.25;  // weight of each pair's realized speedup in the estimate
  // Samples each epoch of a pair needs for the pair to count (fewer: the pair is dropped).
  int32_t min_samples = 8;
};

class DraftingAudit {
 public:
  enum class Verdict { kUnknown, kPays, kDoesNotPay };

  explicit DraftingAudit(DraftingAuditOptions options = {});

  // Whether the next step may draft (the policy plans it as usual) or drafts nothing.
  bool drafting() const { return !options_.enabled || (phase_ == Phase::kShort) != LongDrafts(); }
  // A step the audit counts: it could have drafted and prefilled no prompt chunk. `seconds`: its
  // wall time; `tokens`: what it committed; `decoding`: its decoding sequences; `norm_seconds`:
  // the frozen curve's seconds for the step without drafts (see the header).
  void Observe(double seconds, double tokens, int32_t decoding, double norm_seconds);
  // A step the audit does not count (nothing could draft, or prompt chunks): it still advances
  // the flush after drafting, since the caches refill whatever the step did.
  void Skip();

  Verdict verdict() const { return verdict_; }
  // The realized speedup estimate (1 before the first pair).
  double realized_speedup() const;
  // Pairs of epochs compared so far (each with enough samples on both sides).
  uint64_t pairs() const { return pairs_; }
  // Pairs ended, compared or not: the frozen curve is taken again when this changes.
  uint64_t ended_pairs() const { return ended_pairs_; }
  // Steps (counted or not) that drafted, or were planned without drafts by the audit.
  uint64_t drafting_steps() const { return drafting_steps_; }
  uint64_t audit_steps() const { return audit_steps_; }
  // What the last pair measured (0 before one).
  double last_pair_speedup() const { return last_pair_speedup_; }
  // Steps from the next one on (it included) that certainly draft nothing: the rest of a no-draft
  // epoch (the flush, then its samples; steps that are not samples only add to it), 0 while
  // drafting. A long epoch that may end on max_long_seconds is counted at kOutlierFactor times
  // the last sample's yardstick per step (the most a sample counts), so a batch that grows can
  // end it sooner. The engine skips keeping a drafter's hidden states for such steps
  // (StepPlan::DraftBudget::quiet_steps).
  int64_t UndraftedStepsAhead() const;

 private:
  struct Side {
    double norm = 0;     // sum of norm_seconds x tokens / decoding
    double seconds = 0;  // sum of measured seconds
    int32_t samples = 0;
    void Add(double n, double sec) {
      norm += n;
      seconds += sec;
      ++samples;
    }
    void Add(const Side& o) {
      norm += o.norm;
      seconds += o.seconds;
      samples += o.samples;
    }
    double rate() const { return seconds > 0 ? norm / seconds : 0; }
  };
  enum class Phase {
    kLong,   // the verdict's mode; its last window_steps samples wait in ring_
    kShort,  // the other mode
    kAfter,  // the verdict's mode again: the window after the short epoch
  };
  // Whether the verdict's mode drafts (before a verdict it does).
  bool LongDrafts() const { return verdict_ != Verdict::kDoesNotPay; }
  // The steps of a short epoch in the mode where the long ones draft or not (a check's include
  // its flush, a trial's are followed by one), and the samples that end it (a check's flush
  // steps count toward its length).
  int32_t ShortSteps(bool long_drafts) const;
  int32_t ShortSamples() const;
  // Whether the long epoch may end on max_long_seconds (if it has lasted that long).
  bool MayTimeOut() const;
  // Where a flush's samples go: the window before a check, the trial, or nowhere (drafting
  // stopped for good: no pair counts them).
  enum class FlushTo { kNone, kBefore, kShort };
  // The next flush_steps steps count as drafting, their samples in `to`.
  void StartFlush(FlushTo to);
  // Counts a step; a sample (n, sec) when `sample`.
  void Step(bool sample, double n, double sec);
  // The long epoch's window before the short one, from ring_.
  Side RingSum() const;
  // The short epoch and the window after it are done: learn their realized speedup and update
  // the verdict.
  void EndPair();

  static constexpr double kOutlierFactor = 3.0;
  // Pairs before the first verdict: one pair of a drafter that pays 1.2x read 0.95 at batch 1
  // (a short run's first pair), and stopped it for two long no-draft epochs.
  static constexpr uint64_t kFirstVerdictPairs = 2;

  DraftingAuditOptions options_;
  Verdict verdict_ = Verdict::kUnknown;
  Phase phase_ = Phase::kLong;
  int32_t phase_steps_ = 0;  // samples of the current phase (its flush aside)
  int32_t long_steps_ = 0;   // the long epoch's samples so far, its windows included
  double long_seconds_ = 0;  // their measured seconds
  int32_t long_target_ = 0;  // the long epoch's length
  int32_t flush_left_ = 0;   // steps still counted as drafting after drafting stopped
  FlushTo flush_to_ = FlushTo::kNone;
  std::vector<std::pair<double, double>> ring_;  // the long epoch's last samples (n, seconds)
  size_t ring_next_ = 0;
  Side before_, short_, after_;  // the pair's windows and short epoch (flush steps included)
  double log_estimate_ = 0;      // log of the realized speedup estimate
  uint64_t pairs_ = 0;
  uint64_t ended_pairs_ = 0;
  uint64_t drafting_steps_ = 0;
  uint64_t audit_steps_ = 0;
  double last_pair_speedup_ = 0;
  double last_norm_seconds_ = 0;  // the last sample's yardstick
};

}  // namespace specula
