#include "common/spec/drafting_audit.h"

#include <algorithm>
#include <cmath>

namespace specula {

DraftingAudit::DraftingAudit(DraftingAuditOptions options)
    : options_(options),
      long_target_(std::max(options.min_long_steps, 1)),
      ring_(static_cast<size_t>(std::max(options.window_steps, 1)), {0.0, 0.0}) {}

double DraftingAudit::realized_speedup() const { return std::exp(log_estimate_); }

void DraftingAudit::Observe(double seconds, double tokens, int32_t decoding, double norm_seconds) {
  if (!options_.enabled) return;
  const bool sample = decoding > 0 && norm_seconds > 0 && std::isfinite(norm_seconds) &&
                      std::isfinite(seconds) && seconds > 0 && std::isfinite(tokens);
  if (!sample) {
    Step(false, 0, 0);
    return;
  }
  last_norm_seconds_ = norm_seconds;
  Step(true, norm_seconds * tokens / decoding, std::min(seconds, kOutlierFactor * norm_seconds));
}

int64_t DraftingAudit::UndraftedStepsAhead() const {
  if (drafting()) return 0;
  const int64_t ring = static_cast<int64_t>(ring_.size());
  int64_t samples = 0;
  switch (phase_) {
    case Phase::kLong: {  // a no-draft epoch: until its target (and a full ring), or its time
      int64_t by_target = std::max<int64_t>(long_target_ - long_steps_, 0);
      if (last_norm_seconds_ > 0) {
        const double left = std::max(options_.max_long_seconds - long_seconds_, 0.0);
        const double most = std::ceil(left / (kOutlierFactor * last_norm_seconds_));
        const int64_t timed = std::max<int64_t>(
            static_cast<int64_t>(std::min(most, 1e9)),
            static_cast<int64_t>(options_.long_over_short) * ShortSteps(LongDrafts()) -
                long_steps_);
        by_target = std::min(by_target, timed);
      }
      samples = std::max(by_target, ring - long_steps_);
      break;
    }
    case Phase::kShort:  // a no-draft check
      samples = ShortSamples() - phase_steps_;
      break;
    case Phase::kAfter:  // the no-draft window after a trial; the pair may change the verdict
      samples = ring - phase_steps_;
      break;
  }
  // The next step is one of them whatever: the mode changes only as a sample is counted.
  return flush_left_ + std::max<int64_t>(samples, 1);
}

void DraftingAudit::Skip() {
  if (options_.enabled) Step(false, 0, 0);
}

DraftingAudit::Side DraftingAudit::RingSum() const {
  Side sum;
  const size_t n = std::min(ring_.size(), static_cast<size_t>(std::max(long_steps_, 0)));
  for (size_t i = 0; i < n; ++i) {
    const auto& [norm, seconds] = ring_[(ring_next_ + ring_.size() - 1 - i) % ring_.size()];
    sum.Add(norm, seconds);
  }
  return sum;
}

int32_t DraftingAudit::ShortSteps(bool long_drafts) const {
  return long_drafts ? options_.check_steps : options_.trial_steps + options_.flush_steps;
}

int32_t DraftingAudit::ShortSamples() const {
  return std::max(LongDrafts() ? options_.check_steps - options_.flush_steps : options_.trial_steps,
                  1);
}

bool DraftingAudit::MayTimeOut() const {
  return long_steps_ >= static_cast<int64_t>(options_.long_over_short) * ShortSteps(LongDrafts());
}

void DraftingAudit::StartFlush(FlushTo to) {
  flush_left_ = options_.flush_steps;
  flush_to_ = to;
}

void DraftingAudit::Step(bool sample, double n, double sec) {
  const bool drafted = drafting();
  if (drafted) ++drafting_steps_;
  ++audit_steps_;
  // The steps after drafting stopped belong to drafting, sample or not (the caches refill
  // whatever a step does); only samples count toward the epochs.
  if (flush_left_ > 0) {
    --flush_left_;
    if (sample && flush_to_ == FlushTo::kBefore) before_.Add(n, sec);
    if (sample && flush_to_ == FlushTo::kShort) short_.Add(n, sec);
    return;
  }
  if (!sample) return;
  ++phase_steps_;
  if (phase_ != Phase::kShort) {
    ++long_steps_;
    long_seconds_ += sec;
    ring_[ring_next_] = {n, sec};
    ring_next_ = (ring_next_ + 1) % ring_.size();
  }
  switch (phase_) {
    case Phase::kLong: {
      const bool timed_out = long_seconds_ >= options_.max_long_seconds && MayTimeOut();
      if ((long_steps_ >= long_target_ || timed_out) &&
          long_steps_ >= static_cast<int32_t>(ring_.size())) {
        before_ = RingSum();
        phase_ = Phase::kShort;
        phase_steps_ = 0;
        if (drafted) StartFlush(FlushTo::kBefore);  // a no-draft check starts
      }
      break;
    }
    case Phase::kShort: {
      short_.Add(n, sec);
      if (phase_steps_ >= ShortSamples()) {
        phase_ = Phase::kAfter;
        phase_steps_ = 0;
        if (drafted) StartFlush(FlushTo::kShort);  // the trial ends
      }
      break;
    }
    case Phase::kAfter: {
      after_.Add(n, sec);
      if (phase_steps_ >= static_cast<int32_t>(ring_.size())) EndPair();
      break;
    }
  }
}

void DraftingAudit::EndPair() {
  Side windows = before_;
  windows.Add(after_);
  const Side& drafting = LongDrafts() ? windows : short_;
  const Side& undrafted = LongDrafts() ? short_ : windows;
  const bool compared = drafting.samples >= options_.min_samples &&
                        undrafted.samples >= options_.min_samples && drafting.rate() > 0 &&
                        undrafted.rate() > 0;
  const double speedup = compared ? drafting.rate() / undrafted.rate() : 0;
  const double after_seconds = after_.seconds;
  before_ = short_ = after_ = {};
  ++ended_pairs_;
  phase_ = Phase::kLong;
  phase_steps_ = 0;
  // The long epoch goes on from the window after the short one (its first samples, also the
  // ring's), restarted when the verdict changes below.
  long_steps_ = static_cast<int32_t>(ring_.size());
  long_seconds_ = after_seconds;
  if (!compared) return;
  last_pair_speedup_ = speedup;
  const double pair = std::log(speedup);
  ++pairs_;
  // The mean of the pairs so far, then a moving average: one noisy first pair is not the
  // estimate for its next ~4.
  log_estimate_ +=
      std::max(options_.estimate_rate, 1.0 / static_cast<double>(pairs_)) * (pair - log_estimate_);
  const double estimate = realized_speedup();
  Verdict next = verdict_;
  switch (verdict_) {
    case Verdict::kUnknown:
      // The first verdict waits for kFirstVerdictPairs (the policy drafts as usual meanwhile).
      if (pairs_ >= kFirstVerdictPairs) {
        next = estimate > options_.resume_above ? Verdict::kPays : Verdict::kDoesNotPay;
      }
      break;
    case Verdict::kPays:
      if (estimate < options_.stop_below) next = Verdict::kDoesNotPay;
      break;
    case Verdict::kDoesNotPay:
      if (estimate > options_.resume_above) next = Verdict::kPays;
      break;
  }
  if (LongDrafts() != (next != Verdict::kDoesNotPay)) {
    // The mode of the long epochs changes: a new one starts (and, if drafting stops, a flush
    // that no pair counts).
    if (LongDrafts()) StartFlush(FlushTo::kNone);
    long_steps_ = 0;
    long_seconds_ = 0;
  }
  // The long epochs last as long as keeps the short ones' cost within check_cost of the
  // throughput: a short epoch in the other mode loses (1 - 1/R) of its time where drafting pays
  // R, (1 - R) where it does not.
  const double loss = next == Verdict::kPays ? 1 - 1 / estimate : 1 - estimate;
  const double short_steps = ShortSteps(next == Verdict::kPays);
  const double wanted = next == Verdict::kUnknown
                            ? 0.0  // the next pair soon
                            : short_steps * (std::max(loss, 0.0) / options_.check_cost - 1);
  long_target_ =
      static_cast<int32_t>(std::clamp(wanted, static_cast<double>(options_.min_long_steps),
                                      static_cast<double>(options_.max_long_steps)));
  verdict_ = next;
}

}  // namespace specula
