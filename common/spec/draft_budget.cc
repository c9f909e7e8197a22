#include "common/spec/draft_budget.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <queue>
#include <tuple>
#include <utility>

namespace specula {

// ---------------------------------------------------------------------------------------------
// ForgettingLeastSquares

ForgettingLeastSquares::ForgettingLeastSquares(std::vector<double> prior, double prior_weight,
                                               double forgetting)
    : n_(prior.size()), prior_weight_(prior_weight), forgetting_(forgetting) {
  Reset(std::move(prior));
}

void ForgettingLeastSquares::Reset(std::vector<double> prior) {
  prior_ = std::move(prior);
  n_ = prior_.size();
  a_.assign(n_ * n_, 0.0);
  for (size_t i = 0; i < n_; ++i) a_[i * n_ + i] = prior_weight_;
  b_.resize(n_);
  for (size_t i = 0; i < n_; ++i) b_[i] = prior_weight_ * prior_[i];
  theta_ = prior_;
  l_.resize(n_ * n_);
  z_.resize(n_);
  solved_ = true;
  samples_ = 0;
}

void ForgettingLeastSquares::Add(const std::vector<double>& x, double y) {
  const double keep = forgetting_, anchor = (1.0 - forgetting_) * prior_weight_;
  for (size_t i = 0; i < n_; ++i) {
    for (size_t j = 0; j < n_; ++j) a_[i * n_ + j] = keep * a_[i * n_ + j] + x[i] * x[j];
    a_[i * n_ + i] += anchor;
    b_[i] = keep * b_[i] + x[i] * y + anchor * prior_[i];
  }
  ++samples_;
  solved_ = false;
}

void ForgettingLeastSquares::SetNonNegative(std::vector<size_t> indices) {
  indices.resize(std::min(indices.size(), kMaxNonNegative));
  nonnegative_ = std::move(indices);
  solved_ = false;
}

bool ForgettingLeastSquares::SolveWith(uint32_t zero_mask, std::vector<double>& theta) const {
  // Cholesky of the (symmetric positive definite: prior_weight > 0) normal matrix, each held
  // coefficient's row and column replaced by the identity's (its equation: theta_i = 0). Only
  // the lower triangle of l is read, each entry after it is written.
  auto held = [&](size_t i) {
    for (size_t c = 0; c < nonnegative_.size(); ++c) {
      if ((zero_mask >> c & 1u) != 0 && nonnegative_[c] == i) return true;
    }
    return false;
  };
  auto a = [&](size_t i, size_t j) {
    if (zero_mask != 0 && (held(i) || held(j))) return i == j ? 1.0 : 0.0;
    return a_[i * n_ + j];
  };
  std::vector<double>& l = l_;
  for (size_t j = 0; j < n_; ++j) {
    double d = a(j, j);
    for (size_t k = 0; k < j; ++k) d -= l[j * n_ + k] * l[j * n_ + k];
    if (d <= 0) return false;
    const double ljj = std::sqrt(d);
    l[j * n_ + j] = ljj;
    for (size_t i = j + 1; i < n_; ++i) {
      double s = a(i, j);
      for (size_t k = 0; k < j; ++k) s -= l[i * n_ + k] * l[j * n_ + k];
      l[i * n_ + j] = s / ljj;
    }
  }
  std::vector<double>& z = z_;
  for (size_t i = 0; i < n_; ++i) {
    double s = zero_mask != 0 && held(i) ? 0.0 : b_[i];
    for (size_t k = 0; k < i; ++k) s -= l[i * n_ + k] * z[k];
    z[i] = s / l[i * n_ + i];
  }
  theta.resize(n_);
  for (size_t i = n_; i-- > 0;) {
    double s = z[i];
    for (size_t k = i + 1; k < n_; ++k) s -= l[k * n_ + i] * theta[k];
    theta[i] = s / l[i * n_ + i];
  }
  return true;
}

double ForgettingLeastSquares::Objective(const std::vector<double>& theta) const {
  double f = 0;
  for (size_t i = 0; i < n_; ++i) {
    double row = 0;
    for (size_t j = 0; j < n_; ++j) row += a_[i * n_ + j] * theta[j];
    f += theta[i] * (row - 2 * b_[i]);
  }
  return f;
}

void ForgettingLeastSquares::Solve() const {
  if (solved_) return;
  solved_ = true;
  // Numerically singular: keep the previous solution.
  if (!SolveWith(0, candidate_)) return;
  auto feasible = [&](const std::vector<double>& theta) {
    return std::all_of(nonnegative_.begin(), nonnegative_.end(),
                       [&](size_t i) { return theta[i] >= 0; });
  };
  if (feasible(candidate_)) {
    theta_.swap(candidate_);
    return;
  }
  // The constrained optimum holds some subset of the constrained coefficients at 0 and is the
  // free optimum of the rest: of the feasible subsets' solutions, the one with the least squared
  // error is it (each is a feasible point, so none is below the optimum). At most
  // 2^kMaxNonNegative - 1 more solves, and only when the free fit broke a constraint.
  double best = std::numeric_limits<double>::infinity();
  const uint32_t subsets = 1u << nonnegative_.size();
  for (uint32_t mask = 1; mask < subsets; ++mask) {
    if (!SolveWith(mask, candidate_) || !feasible(candidate_)) continue;
    const double f = Objective(candidate_);
    if (f < best) {
      best = f;
      theta_ = candidate_;
    }
  }
}

namespace {

// A measured time counts as at most kOutlierFactor times its prediction (both cost models).
double WithoutOutlier(double seconds, double predicted) {
  return predicted > 0 ? std::min(seconds, StepCostModel::kOutlierFactor * predicted) : seconds;
}

}  // namespace

double ForgettingLeastSquares::Predict(std::span<const double> x) const {
  Solve();
  double y = 0;
  for (size_t i = 0; i < n_; ++i) y += theta_[i] * x[i];
  return y;
}

// ---------------------------------------------------------------------------------------------
// StepCostModel

namespace {

// Attention work is fitted in units of 1e5 (row x context) so its coefficient is of the order of
// the knots' (seconds) and the prior weight means the same for both.
constexpr double kAttentionUnit = 1e5;
// Without a measured curve, the prior is a roofline: flat (memory-bound) up to this many tokens,
// then linear.
constexpr double kPriorKneeTokens = 16;
constexpr int64_t kAnchorEvery = 32;

}  // namespace

const std::vector<int64_t>& StepCostModel::Knots() {
  static const std::vector<int64_t> knots(kKnotTokens.begin(), kKnotTokens.end());
  return knots;
}

// Features: one hat per knot, then the attention term, then the chunk-step indicator.
StepCostModel::StepCostModel(double forgetting)
    : fit_(std::vector<double>(Knots().size() + 2, 0.0), /*prior_weight=*/0.2, forgetting),
      forgetting_(forgetting),
      visits_(Knots().size(), 0.0),
      recent_visits_(Knots().size(), 0.0) {}

namespace {

// Where `tokens` falls between the knots: the segment's first knot and the weight of the next
// (hat functions: linear interpolation, linear extrapolation past the last knot).
std::pair<size_t, double> KnotSegment(int64_t tokens) {
  const std::vector<int64_t>& k = StepCostModel::Knots();
  const double t = static_cast<double>(std::max<int64_t>(tokens, 1));
  size_t seg = 0;
  while (seg + 2 < k.size() && t > static_cast<double>(k[seg + 1])) ++seg;
  const double lo = static_cast<double>(k[seg]), hi = static_cast<double>(k[seg + 1]);
  return {seg, (t - lo) / (hi - lo)};
}

}  // namespace

std::vector<double> StepCostModel::Features(const StepShape& shape) const {
  const size_t nk = Knots().size();
  std::vector<double> x(nk + 2, 0.0);
  const auto [seg, f] = KnotSegment(shape.tokens);
  x[seg] = 1.0 - f;
  x[seg + 1] = f;
  x[nk] = shape.attention / kAttentionUnit;
  x[nk + 1] = shape.chunk_tokens > 0 ? 1.0 : 0.0;
  return x;
}

void StepCostModel::WarmStart(const std::vector<std::pair<StepShape, double>>& points) {
  for (const auto& [shape, seconds] : points) Observe(shape, seconds);
  // The measured curve becomes the anchor that shapes no recent step visited fall back to.
  if (observed_ > 0) {
    fit_.Reset(fit_.coefficients());
    warm_started_ = true;
  }
  knots_observed_ = -1;  // refreshed at the next prediction
  recent_observed_ = -1;
}

void StepCostModel::Observe(const StepShape& shape, double seconds) {
  if (shape.tokens <= 0 || !(seconds >= 0) || !std::isfinite(seconds)) return;
  if (!has_prior_) {
    const double per_token = seconds / std::max<double>(shape.tokens, kPriorKneeTokens);
    std::vector<double> prior;
    for (int64_t k : Knots()) {
      prior.push_back(per_token * std::max<double>(static_cast<double>(k), kPriorKneeTokens));
    }
    prior.push_back(0.0);  // attention
    prior.push_back(0.0);  // chunk step
    fit_.Reset(std::move(prior));
    has_prior_ = true;
  }
  // A step far slower than its shape has been (preempted, or probably run on caches a drafter's
  // catch-up just evicted: 3-4.5 ms steps among ~1.1 ms ones at batch 1) counts as at most
  // kOutlierFactor times the prediction. One such step on a rarely visited knot priced drafts at
  // 2-3x their cost until the run ended; a real shift in cost still moves the fit, by up to that
  // factor a step. Not during the first steps, while the prediction is still the first guess.
  // The bound needs no fresher fit than a few steps old.
  if (observed_ >= kAnchorEvery) seconds = WithoutOutlier(seconds, PredictRecent(shape));
  const std::vector<double> x = Features(shape);
  fit_.Add(x, seconds);
  bool went_stale = false;
  for (size_t k = 0; k < visits_.size(); ++k) {
    const bool was_fresh = Fresh(k);
    visits_[k] += x[k];
    recent_visits_[k] = forgetting_ * recent_visits_[k] + x[k];
    went_stale |= was_fresh && !Fresh(k);
  }
  ++observed_;
  // The anchor follows the fit where steps went and is interpolated between those knots elsewhere
  // (Anchor), instead of sliding back to the first guess. It is also taken when a knot's steps
  // leave the fit's memory, while its value is still theirs: what a rare probe measured is kept
  // instead of decaying back to the old anchor before the next refresh.
  if (went_stale || observed_ % kAnchorEvery == 0) {
    EnsureKnots();
    fit_.SetAnchor(Anchor());
  }
}

std::vector<double> StepCostModel::Anchor() const {
  std::vector<double> anchor = fit_.coefficients();
  // A knot no recent step visited falls back to what the fresh ones allow (as Predict does), so
  // the fit's memory of it does not pull it back out.
  ClampStale(std::span<double>(anchor).first(Knots().size()));
  if (warm_started_) return anchor;
  const std::vector<int64_t>& k = Knots();
  std::vector<size_t> visited;
  for (size_t i = 0; i < k.size(); ++i) {
    if (visits_[i] >= kVisited) visited.push_back(i);
  }
  if (visited.empty()) return anchor;
  const auto tokens = [&](size_t i) { return static_cast<double>(k[i]); };
  for (size_t i = 0; i < k.size(); ++i) {
    if (visits_[i] >= kVisited) continue;
    auto hi = std::upper_bound(visited.begin(), visited.end(), i);
    if (hi == visited.begin()) {  // below every visited knot: the prior's flat-then-linear shape
      anchor[i] = prices_.knots[*hi] * std::max(tokens(i), kPriorKneeTokens) /
                  std::max(tokens(*hi), kPriorKneeTokens);
    } else if (hi == visited.end()) {  // above them: linear in tokens past the last one
      const size_t lo = visited.back();
      anchor[i] = prices_.knots[lo] * tokens(i) / tokens(lo);
    } else {  // between: the chord, an upper bound wherever the cost is convex in tokens
      const size_t lo = *(hi - 1);
      const double f = (tokens(i) - tokens(lo)) / (tokens(*hi) - tokens(lo));
      anchor[i] = prices_.knots[lo] + f * (prices_.knots[*hi] - prices_.knots[lo]);
    }
  }
  return anchor;
}

bool StepCostModel::Fresh(size_t knot) const { return recent_visits_[knot] >= kFreshVisits; }

bool StepCostModel::MeasuredRecently(int64_t tokens) const {
  const auto [seg, f] = KnotSegment(tokens);
  return (f >= 1.0 || Fresh(seg)) && (f <= 0.0 || Fresh(seg + 1));
}

bool StepCostModel::Visited(int64_t tokens, double steps) const {
  const auto [seg, f] = KnotSegment(tokens);
  return (f >= 1.0 || visits_[seg] >= steps * std::min(kVisited, 1.0 - f)) &&
         (f <= 0.0 || visits_[seg + 1] >= steps * std::min(kVisited, f));
}

void StepCostModel::ClampStale(std::span<double> knots) const {
  const std::vector<int64_t>& k = Knots();
  std::array<double, kKnotCount> fitted;  // bounds from the fit's values
  std::copy(knots.begin(), knots.end(), fitted.begin());
  for (size_t i = 0; i < k.size(); ++i) {
    if (Fresh(i)) continue;
    const double t = static_cast<double>(k[i]);
    double lo = 0, hi = std::numeric_limits<double>::infinity();
    for (size_t j = 0; j < k.size(); ++j) {
      if (j == i || !Fresh(j)) continue;
      const double tj = static_cast<double>(k[j]);
      if (j < i) {
        lo = std::max(lo, fitted[j]);
        hi = std::min(hi, fitted[j] * t / tj);
      } else {
        lo = std::max(lo, fitted[j] * t / tj);
        hi = std::min(hi, fitted[j]);
      }
    }
    knots[i] = std::clamp(knots[i], lo, std::max(lo, hi));
  }
}

void StepCostModel::RelaxStale(std::span<double> knots) const {
  if (warm_started_) return;
  const std::vector<int64_t>& k = Knots();
  std::array<double, kKnotCount> held;
  std::copy(knots.begin(), knots.end(), held.begin());
  for (size_t i = 0; i < k.size(); ++i) {
    if (Fresh(i) || visits_[i] <= 0) continue;
    // The least the fresh knots allow: the fresh knot below, or its share of the one above.
    double lo = 0;
    bool bounded = false;
    for (size_t j = 0; j < k.size(); ++j) {
      if (j == i || !Fresh(j)) continue;
      lo = std::max(
          lo, j < i ? held[j] : held[j] * static_cast<double>(k[i]) / static_cast<double>(k[j]));
      bounded = true;
    }
    if (!bounded || knots[i] <= lo) continue;
    // recent_visits_ fall by the forgetting factor per step: this keeps (recent / fresh)^(1/32)
    // of the held value's excess, halving it every ~32 x 23 steps at 0.97.
    const double kept = std::pow(std::max(recent_visits_[i], 1e-300) / kFreshVisits, kStaleDecay);
    knots[i] = lo + (knots[i] - lo) * std::clamp(kept, 0.0, 1.0);
  }
}

void StepCostModel::RefreshKnots() const {
  knots_observed_ = observed_;
  // Monotone in tokens: each knot at least the one before (noise must never make a bigger step
  // look cheaper), and the attention term at least 0.
  const std::vector<double>& theta = fit_.coefficients();
  const size_t nk = Knots().size();
  std::vector<double>& knots = prices_.knots;
  knots.assign(theta.begin(), theta.begin() + static_cast<std::ptrdiff_t>(nk));
  ClampStale(knots);
  RelaxStale(knots);
  for (size_t i = 1; i < nk; ++i) knots[i] = std::max(knots[i], knots[i - 1]);
  prices_.per_attention = std::max(theta[nk], 0.0) / kAttentionUnit;
  prices_.chunk_step = std::max(theta[nk + 1], 0.0);
}

double StepCostModel::Predict(const StepShape& shape) const {
  if (shape.tokens <= 0 || !ready()) return 0;
  // Features() . knots without building the vector: the policy predicts hundreds of shapes per
  // plan.
  return PredictWith(KnotPart(shape.tokens), shape);
}

double StepCostModel::PredictRecent(const StepShape& shape) const {
  if (shape.tokens <= 0 || !ready()) return 0;
  // While the fit is young (its first kAnchorEvery steps) every step moves it: fresh knots.
  if (recent_observed_ < 0 || observed_ < kAnchorEvery ||
      observed_ - recent_observed_ >= kOutlierRefreshEvery) {
    EnsureKnots();
    recent_ = prices_;
    recent_observed_ = observed_;
  }
  return recent_.Predict(recent_.KnotPart(shape.tokens), shape);
}

double StepCostModel::KnotPart(int64_t tokens) const {
  EnsureKnots();
  return prices_.KnotPart(tokens);
}

double StepCostModel::PredictWith(double knot_part, const StepShape& shape) const {
  // The attention and chunk terms as refreshed with the knots that knot_part came from.
  return prices_.Predict(knot_part, shape);
}

StepCostModel::Prices StepCostModel::Snapshot() const {
  EnsureKnots();
  return prices_;
}

double StepCostModel::Prices::Predict(const StepShape& shape) const {
  if (knots.empty() || shape.tokens <= 0) return 0;
  return Predict(KnotPart(shape.tokens), shape);
}

double StepCostModel::Prices::KnotPart(int64_t tokens) const {
  const auto [seg, f] = KnotSegment(tokens);
  return knots[seg] * (1.0 - f) + knots[seg + 1] * f;
}

double StepCostModel::Prices::Predict(double knot_part, const StepShape& shape) const {
  const double y =
      knot_part + per_attention * shape.attention + (shape.chunk_tokens > 0 ? chunk_step : 0.0);
  return std::max(y, 0.0);
}

// ---------------------------------------------------------------------------------------------
// DrafterCostModel

namespace {
// The features' units set how the fit's prior splits a call's seconds among them while samples
// are few: in proportion to each feature's value in units. A small observed-token unit sends
// the first call's seconds (a drafter's first call catches up on a whole prompt) mostly to its
// observed tokens (charged once per backlog) rather than to a per-call constant that every later
// step would pay, which would keep the drafter off before one steady call was measured; the
// steady calls that follow correct whatever part was really per call.
constexpr double kSeqUnit = 16, kNodeUnit = 64, kDepthUnit = 8, kObservedUnit = 16;
// Calls between two re-anchorings of the drafter cost fit (DrafterCostModel::Observe).
constexpr int64_t kDrafterAnchorEvery = 16;
// A call this many times faster than a young fit predicts restarts the fit (cold starts).
constexpr double kColdStartFactor = 4;

// No allocation: the policy predicts hundreds of drafter calls per plan.
std::array<double, 5> DrafterFeatures(int32_t sequences, int64_t nodes, int32_t max_depth,
                                      double observed) {
  return {1.0, sequences / kSeqUnit, static_cast<double>(nodes) / kNodeUnit, max_depth / kDepthUnit,
          observed / kObservedUnit};
}
}  // namespace

DrafterCostModel::DrafterCostModel(double forgetting)
    : fit_(std::vector<double>(5, 0.0), /*prior_weight=*/0.5, forgetting) {}

bool DrafterCostModel::Observe(const DrafterCall& call) {
  // A catch-up alone (no sequence drafted) measures the observed tokens' part.
  if (call.sequences < 0 || (call.sequences == 0 && call.observed_tokens <= 0)) return false;
  if (!(call.seconds >= 0) || !std::isfinite(call.seconds)) return false;
  const auto x = DrafterFeatures(call.sequences, call.nodes, call.max_depth,
                                 static_cast<double>(call.observed_tokens));
  // A call far slower than its shape has been (the process preempted: 1.8-2.8 ms calls among
  // ~0.5 ms ones at batch 1 on the CPU, with 4 ms target steps beside them) counts as at most
  // kOutlierFactor times the prediction, as a target step does (StepCostModel::Observe). Three
  // such calls fitted a 1.2 ms per-call part (~0.05 ms measured): the draft LM then drafted
  // nothing or 15-node chains, and did not draft again for the rest of the run.
  const double predicted = fit_.samples() > 0 ? fit_.Predict(x) : 0.0;
  // A young fit that a call undercuts many times over was fitted to cold starts: on a GPU a
  // drafter's first calls launch each kernel for the first time (lazy module loading, the GEMM
  // library's first use of a shape): SpecFormer's first call on an H200 took 61 ms where warm
  // ones take ~2. Fitted, such calls kept the drafter off (its probes, priced at them, came
  // seconds apart). The fit starts over from the first warm call.
  const bool restart = fit_.samples() > 0 && fit_.samples() < kDrafterAnchorEvery &&
                       call.seconds * kColdStartFactor < predicted;
  if (restart) fit_.Reset(std::vector<double>(x.size(), 0.0));
  const double seconds = fit_.samples() >= kDrafterAnchorEvery
                             ? WithoutOutlier(call.seconds, predicted)
                             : call.seconds;
  fit_.Add(std::vector<double>(x.begin(), x.end()), seconds);
  // The fit's anchor follows it, as the step cost's does: while a drafter only catches up (its
  // sequences resuming now and then, every call of one shape), those calls do not tell its
  // per-call and per-depth parts from its per-token part, and forgetting toward a zero prior
  // re-split the steady calls' costs among them at random (the draft LM at batch 1 on the CPU:
  // 0.29 ms per depth fitted where steady calls measure 0.17). Anchored, the directions those
  // calls leave unexcited keep what earlier calls measured.
  if (fit_.samples() % kDrafterAnchorEvery == 0) fit_.SetAnchor(fit_.coefficients());
  return restart;
}

DrafterCostModel::Parts DrafterCostModel::parts() const {
  const std::vector<double>& t = fit_.coefficients();
  return {.per_call = t[0],
          .per_sequence = t[1] / kSeqUnit,
          .per_node = t[2] / kNodeUnit,
          .per_depth = t[3] / kDepthUnit,
          .per_observed = t[4] / kObservedUnit};
}

double DrafterCostModel::Predict(int32_t sequences, int64_t nodes, int32_t max_depth,
                                 double observed_tokens) const {
  if (sequences <= 0) return 0;
  // The parts are fitted jointly (clamping one alone would bias the others' sum).
  return std::max(fit_.Predict(DrafterFeatures(sequences, nodes, max_depth, observed_tokens)), 0.0);
}

// ---------------------------------------------------------------------------------------------
// AcceptanceModel

AcceptanceModel::AcceptanceModel(double rate, double prior_rate, double initial, bool streaks)
    : rate_(rate), prior_rate_(prior_rate), streaks_(streaks) {
  accept_.initial.assign(kMaxDepth + 1, initial);
  supply_.initial.assign(kMaxDepth + 1, 1.0);  // a drafter returns what it is asked for
}

namespace {

// How many samples a drafter average's initial value weighs as (see Rates::Update).
constexpr double kInitialSamples = 8;

}  // namespace

const std::vector<double>& AcceptanceModel::Rates::Prior(const std::string& drafter) const {
  auto it = prior.find(drafter);
  return it == prior.end() ? initial : it->second;
}

const std::vector<double>& AcceptanceModel::Rates::Of(const std::string& drafter,
                                                      int64_t id) const {
  auto it = seq.find(id);
  return it != seq.end() ? it->second : Prior(drafter);
}

void AcceptanceModel::Rates::Update(const std::string& drafter, int64_t id, int32_t last,
                                    int32_t hits, double rate, double prior_rate) {
  if (last <= 0) return;  // nothing was in question
  auto [pit, new_prior] = prior.try_emplace(drafter, initial);
  std::vector<double>& average = pit->second;
  auto [sit, new_seq] = seq.try_emplace(id, average);
  std::vector<double>& p = sit->second;
  std::vector<int64_t>& seen = prior_samples[drafter];
  if (seen.empty()) seen.assign(kMaxDepth + 1, 0);
  for (int32_t d = 1; d <= last; ++d) {
    const double hit = d <= hits ? 1.0 : 0.0;
    p[d] += rate * (hit - p[d]);
    // The drafter's average starts as a running mean, the initial value weighing as
    // kInitialSamples samples, then becomes a moving average. New sequences start from it, and
    // while it is low they do not draft, so nothing raises it but probes: two rejections in the
    // first sequence must not set it (with the initial value as one sample, adaptive n-gram at
    // batch 1 started every later sequence at p = 0.17 and left it undrafted).
    const double r = std::max(prior_rate, 1.0 / (static_cast<double>(++seen[d]) + kInitialSamples));
    average[d] += r * (hit - average[d]);
  }
}

void AcceptanceModel::Rates::Relax(const std::string& drafter, int64_t id, double weight) {
  auto it = seq.find(id);
  if (it == seq.end()) return;  // it reads its drafter's average already
  const std::vector<double>& average = Prior(drafter);
  std::vector<double>& p = it->second;
  for (size_t d = 1; d < p.size(); ++d) p[d] += weight * (average[d] - p[d]);
}

namespace {

// Of `offered` positions (at most kMaxDepth), the first `hits` succeeded: positions 1..last were
// in question (the one after the last success failed; nothing past it was tried).
struct Trials {
  int32_t last = 0, hits = 0;
};
Trials Outcome(int32_t offered, int32_t hits) {
  offered = std::min(offered, AcceptanceModel::kMaxDepth);
  hits = std::clamp(hits, 0, std::max(offered, 0));
  return {.last = std::min(offered, hits + 1), .hits = hits};
}

// The streak tables' moving-average weight (see AcceptanceModel::Observe).
constexpr double kStreakRate = 0.01;

// A sequence's acceptance (or supply) p in a streak that moves it by `shift`. A certain 0 or 1
// (a drafter that is always or never right) stays.
double Shifted(double p, double shift) {
  return p <= 0 || p >= 1 ? p : std::clamp(p + shift, 0.0, 1.0);
}

}  // namespace

void AcceptanceModel::Observe(const std::string& drafter, int64_t id, int32_t nodes,
                              int32_t accepted, int32_t depth) {
  // Position j was tried iff the draft had j nodes and the j-1 before it were accepted.
  const Trials t = Outcome(nodes, accepted);
  if (t.last <= 0) return;
  // The streak the draft was made in learns its outcome first; the outcome is the next streak.
  // Each outcome is compared with the sequence's estimate before its last step (what the plan
  // used, less the step whose streak it is), so that what a streak table learns is what that
  // step tells beyond the sequence's level: not which sequences (good or bad) end up in a streak
  // (in a batch of well and badly accepted sequences a rejection is mostly the bad ones'), nor
  // how the average itself moved with that step (it dips at a rejected position, and a step
  // later the truth is above the dip, whatever the text).
  SequenceStreak& seq = streak_[id];
  if (!seq.supply_fresh) seq.supply_before.clear();  // its supply was not observed this step
  seq.supply_fresh = false;
  if (seq.streak != Streak::kNone && !seq.accept_before.empty()) {
    streak_rates_[drafter].accept[static_cast<size_t>(seq.streak) - 1].Learn(seq.accept_before,
                                                                             t.last, t.hits);
  }
  seq.accept_before = accept_.Of(drafter, id);
  accept_.Update(drafter, id, t.last, t.hits, rate_, prior_rate_);
  const int32_t full_depth = std::min(depth > 0 ? depth : nodes, kMaxDepth);
  seq.streak = t.hits == 0            ? Streak::kRejected
               : t.hits >= full_depth ? Streak::kFull
                                      : Streak::kPartial;
}

void AcceptanceModel::StreakRates::Learn(const std::vector<double>& own, int32_t last,
                                         int32_t hits) {
  if (shift.empty()) {
    mean.assign(kMaxDepth + 1, 0.0);
    square.assign(kMaxDepth + 1, 0.25);
    shift.assign(kMaxDepth + 1, 0.0);
    samples.assign(kMaxDepth + 1, 0);
  }
  for (int32_t d = 1; d <= last; ++d) {
    const double residual = (d <= hits ? 1.0 : 0.0) - own[d];
    // A running mean that starts as kInitialSamples samples of no shift, then a moving average
    // over ~1/kStreakRate samples.
    const double n = static_cast<double>(++samples[d]);
    const double w = std::max(kStreakRate, 1.0 / (n + kInitialSamples));
    mean[d] += w * (residual - mean[d]);
    square[d] += w * (residual * residual - square[d]);
    // Used beyond one standard error of the mean only: a step's outcome is a coin toss, and over
    // ~20 samples the means' noise (~0.1) moved estimates as much as a streak does and cost the
    // closed-loop batch-1 test 6% of its throughput.
    const double variance = std::max(square[d] - mean[d] * mean[d], 0.0);
    const double error = std::sqrt(variance / std::min(n + kInitialSamples, 1 / kStreakRate));
    shift[d] = mean[d] > 0 ? std::max(mean[d] - error, 0.0) : std::min(mean[d] + error, 0.0);
  }
}

AcceptanceModel::Streak AcceptanceModel::StreakOf(int64_t id) const {
  auto it = streak_.find(id);
  return it == streak_.end() ? Streak::kNone : it->second.streak;
}

const AcceptanceModel::StreakRates* AcceptanceModel::StreakTable(const std::string& drafter,
                                                                 Streak streak, bool supply) const {
  if (!streaks_ || streak == Streak::kNone) return nullptr;
  auto it = streak_rates_.find(drafter);
  if (it == streak_rates_.end()) return nullptr;
  const size_t i = static_cast<size_t>(streak) - 1;
  const StreakRates& r = supply ? it->second.supply[i] : it->second.accept[i];
  return r.shift.empty() ? nullptr : &r;
}

double AcceptanceModel::StreakShift(const std::string& drafter, Streak streak, int32_t d) const {
  const StreakRates* r = StreakTable(drafter, streak, /*supply=*/false);
  return r == nullptr ? 0.0 : r->shift[std::clamp(d, 1, kMaxDepth)];
}

std::vector<double> AcceptanceModel::StreakShifts(const std::string& drafter, Streak streak,
                                                  int32_t positions) const {
  const StreakRates* r = StreakTable(drafter, streak, /*supply=*/false);
  std::vector<double> shifts(static_cast<size_t>(std::max(positions, 0)), 0.0);
  if (r == nullptr) return shifts;
  for (int32_t d = 1; d <= positions; ++d) shifts[d - 1] = r->shift[std::min(d, kMaxDepth)];
  return shifts;
}

AcceptanceModel::InStreak AcceptanceModel::Streaked(const std::string& drafter, int64_t id) const {
  InStreak in;
  if (!streaks_) return in;
  auto it = streak_.find(id);
  if (it == streak_.end() || it->second.streak == Streak::kNone) return in;
  const SequenceStreak& seq = it->second;
  const StreakRates* accept = StreakTable(drafter, seq.streak, /*supply=*/false);
  if (accept != nullptr && !seq.accept_before.empty()) {
    in.accept = &seq.accept_before;
    in.accept_shift = &accept->shift;
  }
  const StreakRates* supply = StreakTable(drafter, seq.streak, /*supply=*/true);
  if (supply != nullptr && !seq.supply_before.empty()) {
    in.supply = &seq.supply_before;
    in.supply_shift = &supply->shift;
  }
  return in;
}

double AcceptanceModel::SupplyStreakShift(const std::string& drafter, Streak streak,
                                          int32_t j) const {
  const StreakRates* r = StreakTable(drafter, streak, /*supply=*/true);
  return r == nullptr ? 0.0 : r->shift[std::clamp(j, 1, kMaxDepth)];
}

void AcceptanceModel::ObserveSupply(const std::string& drafter, int64_t id, int32_t asked,
                                    int32_t returned) {
  // Node j was in question iff it was asked for and node j-1 came back.
  const Trials t = Outcome(asked, returned);
  if (t.last <= 0) return;
  // In the streak of the sequence's last step, as acceptance (Observe, before which it is
  // called): an n-gram drafter's match is long where the text repeats, so after a draft kept
  // whole it returned 6.0 nodes against 1.0 after an undrafted step (batch 1, one trace).
  SequenceStreak& seq = streak_[id];
  if (seq.streak != Streak::kNone && !seq.supply_before.empty()) {
    streak_rates_[drafter].supply[static_cast<size_t>(seq.streak) - 1].Learn(seq.supply_before,
                                                                             t.last, t.hits);
  }
  seq.supply_before = supply_.Of(drafter, id);
  seq.supply_fresh = true;
  supply_.Update(drafter, id, t.last, t.hits, rate_, prior_rate_);
}

void AcceptanceModel::Relax(const std::string& drafter, int64_t id, double weight) {
  streak_.erase(id);
  weight = std::clamp(weight, 0.0, 1.0);
  if (weight <= 0) return;
  accept_.Relax(drafter, id, weight);
  supply_.Relax(drafter, id, weight);
}

void AcceptanceModel::Forget(int64_t id) {
  accept_.seq.erase(id);
  supply_.seq.erase(id);
  streak_.erase(id);
}

double AcceptanceModel::Conditional(const std::string& drafter, int64_t id, int32_t d) const {
  return accept_.Of(drafter, id)[std::clamp(d, 1, kMaxDepth)];
}

double AcceptanceModel::Supply(const std::string& drafter, int64_t id, int32_t j) const {
  return supply_.Of(drafter, id)[std::clamp(j, 1, kMaxDepth)];
}

double AcceptanceModel::DrafterSupply(const std::string& drafter, int32_t j) const {
  return supply_.Prior(drafter)[std::clamp(j, 1, kMaxDepth)];
}

double AcceptanceModel::DrafterConditional(const std::string& drafter, int32_t d) const {
  return accept_.Prior(drafter)[std::clamp(d, 1, kMaxDepth)];
}

double AcceptanceModel::Expected(const std::string& drafter, int64_t id, int32_t nodes) const {
  const InStreak in = Streaked(drafter, id);
  const std::vector<double>& p = in.accept != nullptr ? *in.accept : accept_.Of(drafter, id);
  double reach = 1.0, sum = 0.0;
  for (int32_t j = 1; j <= nodes; ++j) {
    const int32_t d = std::min(j, kMaxDepth);
    reach *= in.accept_shift != nullptr ? Shifted(p[d], (*in.accept_shift)[d]) : p[d];
    sum += reach;
  }
  return sum;
}

double AcceptanceModel::DrafterStandardError(const std::string& drafter, int32_t d) const {
  d = std::clamp(d, 1, kMaxDepth);
  // Bounded away from 0 and 1: an average that sits at either end is not known exactly.
  const double p = std::clamp(accept_.Prior(drafter)[d], 0.1, 0.9);
  double n = kInitialSamples;
  auto it = accept_.prior_samples.find(drafter);
  if (it != accept_.prior_samples.end()) n += static_cast<double>(it->second[d]);
  return std::sqrt(p * (1 - p) / n);
}

AcceptanceModel::Tables AcceptanceModel::ExpectedDraft(const std::string& drafter, int64_t id,
                                                       int32_t max_nodes, double confidence) const {
  const size_t size = static_cast<size_t>(std::max(max_nodes, 0)) + 1;
  Tables t{.tokens = std::vector<double>(size, 0.0), .rows = std::vector<double>(size, 0.0)};
  const InStreak in = Streaked(drafter, id);
  const std::vector<double>& p = in.accept != nullptr ? *in.accept : accept_.Of(drafter, id);
  const std::vector<double>& s = in.supply != nullptr ? *in.supply : supply_.Of(drafter, id);
  // The upper confidence bound applies to p[1] only (DraftBudgetOptions::acceptance_confidence).
  const double bonus =
      max_nodes > 0 && confidence > 0 ? confidence * DrafterStandardError(drafter, 1) : 0.0;
  double accepted = 1.0, supplied = 1.0;
  for (int32_t j = 1; j <= max_nodes; ++j) {
    const int32_t d = std::min(j, kMaxDepth);
    const double pd = in.accept_shift != nullptr ? Shifted(p[d], (*in.accept_shift)[d]) : p[d];
    accepted *= j == 1 ? std::min(1.0, pd + bonus) : pd;
    supplied *= in.supply_shift != nullptr ? Shifted(s[d], (*in.supply_shift)[d]) : s[d];
    t.tokens[j] = t.tokens[j - 1] + supplied * accepted;
    t.rows[j] = t.rows[j - 1] + supplied;
  }
  return t;
}

// ---------------------------------------------------------------------------------------------
// DraftBudgetPolicy

namespace {

uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Whether a drafter call observed a backlog (a catch-up) rather than what a drafting step commits
// (at most its nodes and one token per sequence).
bool CaughtUp(const DrafterCall& call) {
  return call.observed_tokens - (call.nodes + call.sequences) >= DraftBudgetPolicy::kCatchUpHorizon;
}

// A candidate's expected accepted tokens at its largest budget: what a drafting step of it
// commits beyond the target's token, so what its next call observes.
double SteadyAccepted(const std::vector<AcceptanceModel::Tables>& expected, size_t i) {
  if (i >= expected.size() || expected[i].tokens.empty()) return 0;
  return expected[i].tokens.back();
}

}  // namespace

// What one drafter's call in a step covers, summed over its drafting sequences.
struct Group {
  int32_t sequences = 0;
  int64_t nodes = 0;
  int32_t depth = 0;
  double observed = 0;  // catch-up charged this step (DraftBudgetPolicy::CatchUpCharge)
};

// A plan's drafters, indexed once per evaluation: each candidate's drafter and catch-up charge,
// each drafter's cost model (the allocation predicts a thousand drafter calls per plan at
// batch 64: no name lookup per prediction).
struct DrafterIndex {
  std::vector<size_t> of;                       // per candidate: its drafter
  std::vector<double> charge;                   // per candidate: CatchUpCharge
  std::vector<const DrafterCostModel*> models;  // per drafter; null: never measured

  DrafterIndex(const DraftBudgetPolicy& policy, const std::vector<BudgetCandidate>& candidates,
               const std::vector<AcceptanceModel::Tables>& expected) {
    std::vector<const std::string*> names;
    for (size_t i = 0; i < candidates.size(); ++i) {
      const BudgetCandidate& c = candidates[i];
      const auto it = std::find_if(names.begin(), names.end(),
                                   [&](const std::string* name) { return *name == c.drafter; });
      of.push_back(static_cast<size_t>(it - names.begin()));
      if (it == names.end()) {
        names.push_back(&c.drafter);
        models.push_back(policy.drafter_cost(c.drafter));
      }
      charge.push_back(DraftBudgetPolicy::CatchUpCharge(c, 1.0 + SteadyAccepted(expected, i)));
    }
  }
  size_t size() const { return models.size(); }
  // One call of drafter k covering `g`. A drafter never measured is assumed free: it drafts,
  // gets measured, and the next plans know.
  double Seconds(size_t k, const Group& g) const {
    return models[k] ? models[k]->Predict(g.sequences, g.nodes, g.depth, g.observed) : 0.0;
  }
};

namespace {

// The step without its prompt chunks: its decodes alone.
StepBase WithoutChunks(const StepBase& base) {
  StepBase decodes = base;
  decodes.shape.tokens -= base.chunks.tokens;
  decodes.shape.attention -= base.chunks.attention;
  decodes.shape.chunk_tokens = 0;
  decodes.shape.chunk_attention = 0;
  decodes.chunks = {};
  return decodes;
}

// Attention work of a decoding sequence with `nodes` draft nodes (expected: fractional): its
// pending token and nodes each read the context plus the new rows.
double AttentionRows(int64_t context, double nodes) {
  const double rows = 1.0 + nodes;
  return rows * (static_cast<double>(context) + rows);
}

}  // namespace

double DraftBudgetPolicy::Margin(const StepBase& base) const {
  if (options_.margin_full_batch <= 1) return options_.node_margin;
  const double scale = static_cast<double>(std::max(base.decoding, 1) - 1) /
                       static_cast<double>(options_.margin_full_batch - 1);
  return options_.node_margin * std::min(scale, 1.0);
}

double DraftBudgetPolicy::StepLimit(double no_draft_seconds) const {
  if (options_.max_step_increase < 0) return std::numeric_limits<double>::infinity();
  const double own = no_draft_seconds * (1 + options_.max_step_increase);
  if (!options_.bound_by_gap_tail || !gap_tail_.ready()) return own;
  // The streams' p99 gap stays within the bound while this step's own p99 run does (see
  // step_gap_tail.h).
  return std::max(own, (1 + options_.max_step_increase) * gap_tail_.plain_quantile() -
                           gap_tail_.residual_quantile());
}

double DraftBudgetPolicy::ExplorationLimit(double no_draft_seconds) const {
  if (options_.max_step_increase < 0 || !options_.bound_by_gap_tail || !gap_tail_.ready()) {
    return std::numeric_limits<double>::infinity();
  }
  // Rare steps: up to the bound on the p99 gap itself, without room for their own overrun.
  return std::max(StepLimit(no_draft_seconds),
                  (1 + options_.max_step_increase) * gap_tail_.plain_quantile());
}

double BudgetDecision::predicted_speedup() const {
  if (predicted_seconds <= 0 || no_draft_seconds <= 0 || no_draft_tokens <= 0) return 1.0;
  return (predicted_tokens / predicted_seconds) / (no_draft_tokens / no_draft_seconds);
}

DraftBudgetPolicy::DraftBudgetPolicy(DraftBudgetOptions options)
    : options_(options),
      chunk_fit_({0.0, 0.0}, /*prior_weight=*/0.2, /*forgetting=*/0.97),
      acceptance_(/*rate=*/0.1, /*prior_rate=*/0.05, /*initial=*/0.5, options.acceptance_streaks),
      idle_audit_(options.audit),
      rng_(options.seed) {
  chunk_fit_.SetNonNegative({0, 1});
}

StepShape DraftBudgetPolicy::DecodePart(const StepShape& shape) {
  const double chunk = static_cast<double>(std::max<int64_t>(shape.chunk_tokens, 0));
  const double chunk_attention =
      shape.chunk_attention > 0 ? shape.chunk_attention : chunk * chunk / 2;
  return {.tokens = shape.tokens - shape.chunk_tokens,
          .attention = std::max(0.0, shape.attention - chunk_attention)};
}

double DraftBudgetPolicy::ChunkPart(const StepShape& shape) const {
  if (shape.chunk_tokens <= 0) return 0;
  const std::vector<double>& c = chunk_fit_.coefficients();
  return c[0] + c[1] * static_cast<double>(shape.chunk_tokens) / kChunkRowUnit;
}

double DraftBudgetPolicy::PredictTarget(const StepShape& shape, bool recent) const {
  auto price = [&](const StepShape& s) {
    return recent ? target_cost_.PredictRecent(s) : target_cost_.Predict(s);
  };
  if (shape.chunk_tokens <= 0 || !ChunkFitReady()) return price(shape);
  return price(DecodePart(shape)) + ChunkPart(shape);
}

const DrafterCostModel* DraftBudgetPolicy::drafter_cost(const std::string& drafter) const {
  auto it = drafter_cost_.find(drafter);
  return it == drafter_cost_.end() ? nullptr : &it->second;
}

double DraftBudgetPolicy::CatchUpCharge(const BudgetCandidate& candidate, double steady_tokens) {
  const double backlog = static_cast<double>(std::max<int64_t>(candidate.unobserved_tokens, 0));
  // A drafting sequence observes what its last step committed: at most its nodes plus the
  // target's token.
  const double steady = std::min(
      {backlog, std::max(steady_tokens, 1.0), static_cast<double>(candidate.max_nodes) + 1.0});
  int64_t horizon = kCatchUpHorizon;
  if (candidate.tokens_left >= 0) horizon = std::min(horizon, candidate.tokens_left);
  return steady + (backlog - steady) / static_cast<double>(std::max<int64_t>(horizon, 1));
}

double DraftBudgetPolicy::TargetSeconds(StepShape shape, double rows, std::vector<double>* knots,
                                        int64_t knots_from) const {
  // A step with prompt chunks, once chunk_fit_ is ready: its decode part at the step cost fit's
  // prices plus the chunks' (all the shapes here hold the same chunks: one base's).
  const bool split = shape.chunk_tokens > 0 && ChunkFitReady();
  const double chunk_part = split ? ChunkPart(shape) : 0.0;
  auto predict = [&](const StepShape& full) {
    const StepShape at = split ? DecodePart(full) : full;
    const int64_t slot = full.tokens - knots_from;
    if (knots == nullptr || at.tokens <= 0 || !target_cost_.ready() || slot < 0) {
      return target_cost_.Predict(at) + chunk_part;
    }
    if (static_cast<size_t>(slot) >= knots->size()) {
      knots->resize(static_cast<size_t>(slot) + 1, std::numeric_limits<double>::quiet_NaN());
    }
    double& part = (*knots)[static_cast<size_t>(slot)];
    if (std::isnan(part)) part = target_cost_.KnotPart(at.tokens);
    return target_cost_.PredictWith(part, at) + chunk_part;
  };
  const double whole = std::floor(std::max(rows, 0.0));
  shape.tokens += static_cast<int64_t>(whole);
  double seconds = predict(shape);
  const double fraction = rows - whole;
  if (fraction > 0) {
    ++shape.tokens;
    seconds += fraction * (predict(shape) - seconds);
  }
  return seconds + DraftedStepExcess(rows);
}

double DraftBudgetPolicy::ExcessOf(const DraftedSteps* set, double rows) {
  if (set == nullptr || rows <= 0 || set->excess.samples() == 0) return 0;
  const std::array<double, 2> x = {1.0, rows / kDraftRowUnit};
  return std::max(set->excess.Predict(x), 0.0);
}

DraftBudgetPolicy::DraftedSteps& DraftBudgetPolicy::DraftedOf(const std::string& key) {
  return drafted_.try_emplace(key).first->second;
}

const std::string& DraftBudgetPolicy::SetKey(std::vector<const std::string*>& names) {
  std::sort(names.begin(), names.end(),
            [](const std::string* a, const std::string* b) { return *a < *b; });
  names.erase(std::unique(names.begin(), names.end(),
                          [](const std::string* a, const std::string* b) { return *a == *b; }),
              names.end());
  audit_key_.clear();
  for (const std::string* n : names) {
    if (!audit_key_.empty()) audit_key_ += ',';
    audit_key_ += *n;
  }
  return audit_key_;
}

const std::string& DraftBudgetPolicy::StepDrafters(const StepMeasurement& step) {
  std::vector<const std::string*> names;
  for (const DrafterCall& call : step.drafter_calls) names.push_back(&call.drafter);
  for (const StepMeasurement::Sequence& q : step.sequences) {
    if (q.nodes > 0) names.push_back(&q.drafter);
  }
  return SetKey(names);
}

std::vector<AcceptanceModel::Tables> DraftBudgetPolicy::ExpectedDrafts(
    const std::vector<BudgetCandidate>& candidates) const {
  std::vector<AcceptanceModel::Tables> expected;
  expected.reserve(candidates.size());
  for (const BudgetCandidate& c : candidates) {
    expected.push_back(
        acceptance_.ExpectedDraft(c.drafter, c.id, c.max_nodes, options_.acceptance_confidence));
  }
  return expected;
}

std::pair<double, double> DraftBudgetPolicy::Evaluate(
    const StepBase& base, const std::vector<BudgetCandidate>& candidates,
    const std::vector<AcceptanceModel::Tables>& expected, const std::vector<int32_t>& budgets,
    StepShape* shape_out, double* rows_out) const {
  StepShape shape = base.shape;
  double rows = 0;
  double tokens = base.decoding;
  const DrafterIndex drafters(*this, candidates, expected);
  std::vector<Group> groups(drafters.size());
  for (size_t i = 0; i < candidates.size(); ++i) {
    const int32_t n = std::min(budgets[i], candidates[i].max_nodes);
    if (n <= 0) continue;
    const BudgetCandidate& c = candidates[i];
    const double r = expected[i].rows[n];
    rows += r;
    shape.attention += AttentionRows(c.context, r) - AttentionRows(c.context, 0);
    tokens += expected[i].tokens[n];
    Group& g = groups[drafters.of[i]];
    ++g.sequences;
    g.nodes += n;
    g.depth = std::max(g.depth, n);
    g.observed += drafters.charge[i];
  }
  double seconds = RowFloor(base).Apply(TargetSeconds(shape, rows), rows) + other_seconds_;
  for (size_t k = 0; k < groups.size(); ++k) seconds += drafters.Seconds(k, groups[k]);
  if (shape_out) *shape_out = shape;
  if (rows_out) *rows_out = rows;
  return {seconds, tokens};
}

double DraftBudgetPolicy::NoDraftSeconds(const StepBase& base) const {
  return TargetSeconds(base.shape, 0) + other_seconds_;  // Evaluate's with every budget 0
}

double DraftBudgetPolicy::ChunkSeconds(const StepBase& base) const {
  return PredictTarget(base.shape) - target_cost_.Predict(WithoutChunks(base).shape);
}

DraftBudgetPolicy::DraftRowFloor DraftBudgetPolicy::RowFloor(const StepBase& base) const {
  if (base.chunks.tokens <= 0) return {};
  return {.base_seconds = TargetSeconds(base.shape, 0),
          .row_seconds = ChunkSeconds(base) / static_cast<double>(base.chunks.tokens)};
}

double DraftBudgetPolicy::TokensPerSecondPrice(const StepBase& base, double seconds,
                                               double tokens) const {
  if (!options_.prune_by_reach || !target_cost_.ready()) return 0;
  const double rate = tokens / std::max(seconds - ChunkSeconds(base), 1e-12);
  const double price = rate * (1 + Margin(base));
  return std::isfinite(price) ? std::max(price, 0.0) : 0.0;
}

double DraftBudgetPolicy::MinReach(const StepShape& shape, double rows, double price) const {
  if (price <= 0) return 0;
  // The row's own attention is left out (a row of context c adds ~c of the shape's attention,
  // small next to the row's weights at the contexts served).
  const double row = TargetSeconds(shape, rows + 1) - TargetSeconds(shape, rows);
  const double reach = row * price;
  return std::isfinite(reach) ? std::clamp(reach, 0.0, 1.0) : 0.0;
}

double DraftBudgetPolicy::DepthReach(const std::string& drafter, double price) const {
  const DrafterCostModel* cost = drafter_cost(drafter);
  if (price <= 0 || !cost || !cost->ready()) return 0;
  // At batch 1 a chain's nodes and depths move together, so the fit's split between the two is
  // arbitrary: a depth is priced as both.
  const DrafterCostModel::Parts parts = cost->parts();
  const double reach = (std::max(parts.per_depth, 0.0) + std::max(parts.per_node, 0.0)) * price;
  return std::isfinite(reach) ? std::max(reach, 0.0) : 0.0;
}

std::vector<int32_t> DraftBudgetPolicy::Allocate(
    const StepBase& base, const std::vector<BudgetCandidate>& candidates,
    const std::vector<AcceptanceModel::Tables>& expected, double step_limit) const {
  const DrafterIndex drafters(*this, candidates, expected);
  std::vector<double> sunk(drafters.size(), 0.0);
  std::vector<bool> amortized(drafters.size(), false);
  std::vector<int32_t> b =
      Greedy(base, candidates, expected, step_limit, drafters, sunk, &amortized);
  // A drafter whose call no single sequence earns back may still pay when the batch shares it
  // (a call's fixed cost, a GPU's kernel launches, is the same for 1 sequence as for 64): the
  // greedy pass charges the whole call to the first sequence that drafts, so at batch 64 a
  // drafter with a 1.8 ms call beside a 3 ms step never started, though all 64 sequences drafting
  // would add ~1.5 tokens each. Where a sequence's first bundle would have paid without the call
  // (`amortized`), allocate again with the unused drafters' per-call seconds left out of the
  // ratios (still counted in the step's seconds), and keep that allocation if the whole step's
  // decoding rate beats the first one's by the margin. A drafter with one candidate has nobody to
  // share its call with: its first bundle's ratio already was the whole step's comparison.
  auto drafts = [&](const std::vector<int32_t>& budgets, size_t k) {
    for (size_t i = 0; i < candidates.size(); ++i) {
      if (drafters.of[i] == k && budgets[i] > 0) return true;
    }
    return false;
  };
  bool retry = false;
  for (size_t k = 0; k < drafters.size(); ++k) {
    if (!amortized[k] || drafters.models[k] == nullptr || drafts(b, k)) continue;
    if (std::count(drafters.of.begin(), drafters.of.end(), k) < 2) continue;
    sunk[k] = std::max(0.0, drafters.models[k]->parts().per_call);
    retry |= sunk[k] > 0;
  }
  const double chunk_seconds = ChunkSeconds(base);
  auto rate = [&](const std::vector<int32_t>& budgets) {
    const auto [seconds, tokens] = Evaluate(base, candidates, expected, budgets);
    return tokens / std::max(seconds - chunk_seconds, 1e-12);
  };
  if (retry) {
    std::vector<int32_t> shared =
        Greedy(base, candidates, expected, step_limit, drafters, sunk, nullptr);
    if (shared != b && rate(shared) > rate(b) * (1 + Margin(base)) &&
        Evaluate(base, candidates, expected, shared).first <= step_limit) {
      b = std::move(shared);
    }
  }
  // A drafter whose per-call cost the allocation does not earn back is left off.
  for (size_t k = 0; k < drafters.size(); ++k) {
    if (!drafts(b, k)) continue;
    std::vector<int32_t> without = b;
    for (size_t i = 0; i < candidates.size(); ++i) {
      if (drafters.of[i] == k) without[i] = 0;
    }
    if (rate(without) >= rate(b)) b = without;
  }
  return b;
}

std::vector<int32_t> DraftBudgetPolicy::Greedy(const StepBase& base,
                                               const std::vector<BudgetCandidate>& candidates,
                                               const std::vector<AcceptanceModel::Tables>& expected,
                                               double step_limit, const DrafterIndex& drafters,
                                               const std::vector<double>& sunk,
                                               std::vector<bool>* amortized) const {
  std::vector<bool> continuing(candidates.size());
  for (size_t i = 0; i < candidates.size(); ++i) {
    continuing[i] = options_.margin_hysteresis && drafted_last_plan_.count(candidates[i].id) > 0;
  }
  // Greedy marginal allocation (see the header). State of the allocation so far:
  const size_t n = candidates.size();
  std::vector<int32_t> b(n, 0);
  StepShape shape = base.shape;  // its tokens stay the base's: the drafts' rows are `rows`
  double rows = 0;               // expected (a drafter may return fewer nodes than asked)
  double tokens = base.decoding;
  std::vector<Group> groups(drafters.size());
  // Each drafter's call at `groups`; a sunk call's fixed part counts as paid (left out of the
  // ratios) and is added to the step's seconds when its first sequence drafts.
  std::vector<double> group_seconds = sunk;
  const DraftRowFloor row_floor = RowFloor(base);
  // The step cost fit's knot part by token count: the same few counts are predicted for every
  // sequence's bundles (the first-bundle scan is half of a batch-64 plan's host time).
  std::vector<double> knots;
  auto target = [&](const StepShape& at, double r) {
    return TargetSeconds(at, r, &knots, base.shape.tokens);
  };
  double target_seconds = row_floor.Apply(target(shape, rows), rows);
  double drafters_seconds = 0;
  int64_t nodes = 0;  // allocated so far, against base.max_nodes
  auto total = [&] { return target_seconds + drafters_seconds + other_seconds_; };
  // What a node must beat: the batch's decoding rate, tokens over the step's seconds without
  // its prompt chunks (ChunkSeconds).
  const double chunk_seconds = ChunkSeconds(base);
  auto rate = [&] { return tokens / std::max(total() - chunk_seconds, 1e-12); };
  // Expected tokens and added seconds of giving candidate i `m` more nodes now.
  auto delta = [&](size_t i, int32_t m) {
    const BudgetCandidate& c = candidates[i];
    const int32_t from = b[i], to = b[i] + m;
    const double dy = expected[i].tokens[to] - expected[i].tokens[from];
    const double row_from = expected[i].rows[from], row_to = expected[i].rows[to];
    StepShape next = shape;
    next.attention += AttentionRows(c.context, row_to) - AttentionRows(c.context, row_from);
    const size_t k = drafters.of[i];
    Group h = groups[k];
    if (from == 0) {
      ++h.sequences;
      h.observed += drafters.charge[i];
    }
    h.nodes += m;
    h.depth = std::max(h.depth, to);
    const double dt =
        (row_floor.Apply(target(next, rows + row_to - row_from), rows + row_to - row_from) -
         target_seconds) +
        (drafters.Seconds(k, h) - group_seconds[k]);
    return std::pair<double, double>(dy, std::max(dt, 1e-12));
  };
  // A sequence not drafting yet: its best first bundle (it pays the per-sequence costs once).
  constexpr int32_t kMaxFirstBundle = 16;
  // Per drafter, its per-call seconds (for `amortized`: 0 when not asked).
  std::vector<double> per_call(drafters.size(), 0.0);
  if (amortized != nullptr) {
    for (size_t k = 0; k < drafters.size(); ++k) {
      if (drafters.models[k] != nullptr) {
        per_call[k] = std::max(0.0, drafters.models[k]->parts().per_call);
      }
    }
  }
  // The best first bundle that would beat the decoding rate, by the margin, if its drafter's call
  // were already paid for (see Allocate).
  auto note_amortized = [&](size_t i, double dy, double dt) {
    const size_t k = drafters.of[i];
    // Only a bundle that would open its drafter's call pays it.
    if (b[i] != 0 || groups[k].sequences != 0 || per_call[k] <= 0) return;
    if ((*amortized)[k] || dt - per_call[k] <= 0) return;
    const double margin = continuing[i] ? 0.0 : Margin(base);
    if (dy / (dt - per_call[k]) > rate() * (1 + margin)) (*amortized)[k] = true;
  };
  auto best_move = [&](size_t i) {
    int32_t best_m = 0;
    double best_ratio = -1;
    const int32_t limit = b[i] == 0 ? std::min(candidates[i].max_nodes, kMaxFirstBundle)
                                    : std::min(1, candidates[i].max_nodes - b[i]);
    for (int32_t m = 1; m <= limit; ++m) {
      const auto [dy, dt] = delta(i, m);
      if (amortized != nullptr) note_amortized(i, dy, dt);
      if (dy / dt > best_ratio) {
        best_ratio = dy / dt;
        best_m = m;
      }
    }
    return std::pair<int32_t, double>(best_m, best_ratio);
  };
  using Entry = std::tuple<double, size_t, int32_t>;  // ratio, candidate, nodes
  std::priority_queue<Entry> heap;
  for (size_t i = 0; i < n; ++i) {
    if (candidates[i].max_nodes <= 0) continue;
    const auto [m, ratio] = best_move(i);
    if (m > 0) heap.emplace(ratio, i, m);
  }
  while (!heap.empty()) {
    auto [stale, i, m] = heap.top();
    heap.pop();
    const auto [dy, dt] = delta(i, m);
    const double ratio = dy / dt;
    // The shape moved since the entry was made: re-queue it unless it still leads.
    if (!heap.empty() && ratio < std::get<0>(heap.top()) * 0.999 && ratio < stale * 0.999) {
      heap.emplace(ratio, i, m);
      continue;
    }
    // Worth it only if it raises the batch's tokens per second, by the margin.
    // The margin is waived for the first nodes of a sequence that drafted at the last plan: its
    // drafting step's cost is what the last steps measured, and stopping is not free (resuming
    // pays a catch-up, and an idle sequence's acceptance is measured no more), so it goes on
    // while drafting at least breaks even.
    const double margin = b[i] == 0 && continuing[i] ? 0.0 : Margin(base);
    if (dy <= 0 || ratio <= rate() * (1 + margin)) continue;
    if ((base.max_nodes >= 0 && nodes + m > base.max_nodes) || total() + dt > step_limit) {
      // Past the step's token budget or the latency bound: a smaller first bundle may fit.
      if (m > 1) heap.emplace(ratio, i, m - 1);
      continue;
    }
    const BudgetCandidate& c = candidates[i];
    const size_t k = drafters.of[i];
    Group& g = groups[k];
    if (b[i] == 0) {
      if (g.sequences == 0) drafters_seconds += sunk[k];
      ++g.sequences;
      g.observed += drafters.charge[i];
    }
    const double row_from = expected[i].rows[b[i]], row_to = expected[i].rows[b[i] + m];
    rows += row_to - row_from;
    shape.attention += AttentionRows(c.context, row_to) - AttentionRows(c.context, row_from);
    tokens += dy;
    b[i] += m;
    nodes += m;
    g.nodes += m;
    g.depth = std::max(g.depth, b[i]);
    const double after = drafters.Seconds(k, g);
    drafters_seconds += after - group_seconds[k];
    group_seconds[k] = after;
    target_seconds = row_floor.Apply(target(shape, rows), rows);
    if (b[i] < c.max_nodes) {
      const auto [next_m, next_ratio] = best_move(i);
      if (next_m > 0) heap.emplace(next_ratio, i, next_m);
    }
  }
  return b;
}

int32_t DraftBudgetPolicy::ProbeWait(const std::string& drafter) const {
  auto backoff = probe_backoff_.find(drafter);
  return options_.probe_after * (backoff == probe_backoff_.end() ? 1 : backoff->second);
}

bool DraftBudgetPolicy::ReuseQuietPlan(const StepBase& base,
                                       const std::vector<BudgetCandidate>& candidates,
                                       BudgetDecision* decision) {
  if (quiet_.reusable <= 0 || base.max_nodes == 0 || candidates.empty()) return false;
  // Its rows are the decodes' pending tokens and its prompt chunks, nothing else.
  if (base.shape.tokens - base.chunks.tokens != base.decoding) return false;
  bool members = candidates.size() == quiet_.candidates.size();
  for (size_t i = 0; members && i < candidates.size(); ++i) {
    members = candidates[i].id == quiet_.candidates[i].first &&
              candidates[i].drafter == quiet_.candidates[i].second;
  }
  // The planned batch, decode-only: the plan as made (its predictions are the step's too). A step
  // with prompt chunks (41% of steps at batch 64) reuses it too: its chunks price draft rows at
  // least as high as the decodes alone (the step cost is convex in rows; the chunks are not the
  // decodes' to earn back).
  const bool same =
      members && quiet_.planned && base.chunks.tokens == 0 && base.decoding == quiet_.decoding;
  if (!members) {
    // Otherwise a batch within 1/8 of the planned one whose sequences all draft with the plan's
    // drafters: KeepIfQuiet checked that none of them pays even at its drafter's average
    // acceptance, which is where a new sequence starts. At batch 64 on the CPU a request joined
    // or left nearly every step, so without this 87% of plans were full ones, ~70 us each.
    if (std::abs(base.decoding - quiet_.decoding) > quiet_.decoding / 8) return false;
    for (const BudgetCandidate& c : candidates) {
      const bool known = std::find(quiet_.drafters.begin(), quiet_.drafters.end(), c.drafter) !=
                         quiet_.drafters.end();
      if (!known || trial_left_.count(c.id) > 0) return false;
    }
  }
  for (const BudgetCandidate& c : candidates) {
    if (c.max_nodes <= 0) return false;
  }
  // A probe that waited for the share goes ahead as soon as the share allows it: planned in full
  // from a little before (its cost moves with the models), as then it may fit.
  if (quiet_.waiting_extra >= 0 && explored_seconds_ + kWaitingExtraShare * quiet_.waiting_extra <=
                                       options_.exploration_share * measured_seconds_) {
    return false;
  }
  if (!members) {
    // The batch changed: the reuses so far are credited to the sequences they planned, and the
    // next ones to this batch, whose probes come due when full plans would have them.
    CreditQuietPlans();
    quiet_.candidates.clear();
    for (const BudgetCandidate& c : candidates) quiet_.candidates.emplace_back(c.id, c.drafter);
    quiet_.planned = false;
    quiet_.due_in = static_cast<int32_t>(std::max<int64_t>(PlansBeforeExploration(candidates), 0));
  }
  // A probe or the extra node due from this plan on: planned in full once the share has room.
  if (quiet_.due_in <= 0 && !ExplorationShareUsedUp()) return false;
  --quiet_.reusable;
  --quiet_.due_in;
  ++quiet_.reused;
  ++plans_;
  ++quiet_plans_;
  // A full plan here would draw the extra node's sequence (and find no room for it): the same
  // draw keeps later plans' choices those of full plans.
  if (options_.explore_every > 0 && plans_ % static_cast<uint64_t>(options_.explore_every) == 0) {
    SplitMix(rng_);
  }
  *decision = same ? quiet_.decision : ZeroDecision(base, candidates.size());
  return true;
}

BudgetDecision DraftBudgetPolicy::Undrafted(size_t n, double seconds, int32_t decoding) {
  BudgetDecision d;
  d.budgets.assign(n, 0);
  d.depth_reach.assign(n, 0.0);
  d.no_draft_seconds = seconds;
  d.no_draft_tokens = static_cast<double>(decoding);
  d.predicted_seconds = d.no_draft_seconds;
  d.predicted_tokens = d.no_draft_tokens;
  return d;
}

BudgetDecision DraftBudgetPolicy::ZeroDecision(const StepBase& base, size_t n) const {
  BudgetDecision d = Undrafted(n, NoDraftSeconds(base), base.decoding);
  d.min_reach =
      MinReach(base.shape, 0, TokensPerSecondPrice(base, d.predicted_seconds, d.predicted_tokens));
  return d;
}

bool DraftBudgetPolicy::RemeasuresTheStepWithoutDrafts(
    const StepBase& base, const std::vector<BudgetCandidate>& candidates,
    const std::vector<AcceptanceModel::Tables>& expected, const BudgetDecision& decision) const {
  if (options_.remeasure_below_speedup <= 1 || base.chunks.tokens > 0 ||
      std::all_of(decision.budgets.begin(), decision.budgets.end(),
                  [](int32_t b) { return b == 0; })) {
    return false;
  }
  // Never measured, the price of not drafting is the first guess, whatever gain the drafts show
  // against it: measured first (see remeasure_below_speedup).
  if (!target_cost_.Visited(base.shape.tokens)) return true;
  if (plans_ < remeasured_at_plan_ + kPlansPerRemeasure ||
      target_cost_.MeasuredRecently(base.shape.tokens)) {
    return false;
  }
  // Measured by a few steps only (a run's first, on cold caches), the price is measured again
  // whatever the gain.
  if (!target_cost_.Visited(base.shape.tokens, kSettledSteps)) return true;
  const auto [seconds, tokens] = Evaluate(base, candidates, expected, decision.budgets);
  // tokens / seconds < factor x no-draft tokens / no-draft seconds, without dividing.
  return tokens * decision.no_draft_seconds <
         options_.remeasure_below_speedup * seconds * decision.no_draft_tokens;
}

BudgetDecision DraftBudgetPolicy::PlanWithoutRoom(const StepBase& base,
                                                  const std::vector<BudgetCandidate>& candidates) {
  // What a full plan does when the step has no room (see Plan): no sequence drafts, probes or
  // counts the plan as idle, and each relaxes; a quiet plan goes on past it (it is one plan
  // nearer the extra node). At batch 64 on the CPU 41% of steps were full of prompt chunks, each
  // a ~70 us full plan.
  ++plans_;
  pending_exploration_ = {};
  if (quiet_.reusable > 0) --quiet_.due_in;
  for (const BudgetCandidate& c : candidates) {
    drafted_last_plan_.erase(c.id);
    // Ends its streak (it does not draft), and relaxes it if it could have drafted.
    acceptance_.Relax(c.drafter, c.id, c.max_nodes > 0 ? options_.idle_relaxation : 0);
  }
  return ZeroDecision(base, candidates.size());
}

int64_t DraftBudgetPolicy::PlansBeforeExploration(
    const std::vector<BudgetCandidate>& candidates) const {
  int64_t due = std::numeric_limits<int32_t>::max();
  if (options_.probe_after > 0) {
    for (const BudgetCandidate& c : candidates) {
      auto idle = idle_plans_.find(c.id);
      const int64_t idle_plans = idle == idle_plans_.end() ? 0 : idle->second;
      due = std::min(due, ProbeWait(c.drafter) - idle_plans - 1);
    }
  }
  if (options_.explore_every > 0) {
    const auto every = static_cast<uint64_t>(options_.explore_every);
    due = std::min(due, static_cast<int64_t>(every - plans_ % every) - 1);
  }
  return due;
}

bool DraftBudgetPolicy::ExplorationShareUsedUp() const {
  return explored_seconds_ >= options_.exploration_share * measured_seconds_;
}

void DraftBudgetPolicy::EndQuietPlans() {
  CreditQuietPlans();
  quiet_ = {};
}

void DraftBudgetPolicy::CreditQuietPlans() {
  // What each reusing plan would have done for a sequence at 0 (see Plan): one more idle plan,
  // one more relaxation. A sequence that left meanwhile has no state to update.
  for (const auto& [id, drafter] : quiet_.candidates) {
    if (quiet_.reused == 0) break;
    if (options_.probe_after > 0) {
      auto idle = idle_plans_.find(id);
      if (idle != idle_plans_.end()) idle->second += quiet_.reused;
    }
    if (options_.idle_relaxation > 0) {
      // r relaxations of weight w are one of weight 1 - (1 - w)^r: the averages they move toward
      // stay put while every sequence is at 0 (one call per sequence, not one per reused plan:
      // 6 us of a batch-4 full plan in the engine).
      const double w = std::clamp(options_.idle_relaxation, 0.0, 1.0);
      acceptance_.Relax(drafter, id, 1 - std::pow(1 - w, quiet_.reused));
    }
  }
  quiet_.reused = 0;
}

void DraftBudgetPolicy::KeepIfQuiet(const StepBase& base,
                                    const std::vector<BudgetCandidate>& candidates,
                                    const BudgetDecision& decision, double waiting_extra) {
  if (options_.quiet_replan_every <= 1 || candidates.empty() || !target_cost_.ready() ||
      base.max_nodes == 0) {
    return;
  }
  for (int32_t b : decision.budgets) {
    if (b != 0) return;
  }
  // A step with prompt chunks stands for the decode-only steps after it only if those leave
  // every sequence at 0 too (its chunks price draft rows higher). 41% of steps at batch 64.
  const StepBase decodes = base.chunks.tokens > 0 ? WithoutChunks(base) : base;
  const double decodes_seconds =
      base.chunks.tokens > 0 ? NoDraftSeconds(decodes) : decision.no_draft_seconds;
  // Not while the models are young: a step cost fit of a few steps, or a drafter probed outside
  // the share until its cost fit holds young_drafter_calls calls, can change the plan any step.
  if (target_cost_.observed() < kQuietAfterSteps) return;
  for (const BudgetCandidate& c : candidates) {
    const DrafterCostModel* model = drafter_cost(c.drafter);
    if (options_.young_drafter_calls > 0 &&
        (model == nullptr || model->calls() < options_.young_drafter_calls)) {
      return;
    }
  }
  const int64_t reusable = options_.quiet_replan_every - 1;
  int64_t due = reusable;  // plans before a probe or the extra node comes due
  bool probe_due = false;  // a sequence's probe is due (it waits for the share)
  for (const BudgetCandidate& c : candidates) {
    if (trial_left_.count(c.id) > 0) return;
    if (options_.probe_after <= 0) continue;
    const int64_t wait = ProbeWait(c.drafter);
    auto idle = idle_plans_.find(c.id);
    const int64_t idle_plans = idle == idle_plans_.end() ? 0 : idle->second;
    if (idle_plans >= wait) {
      if (waiting_extra < 0) return;  // due, and not waiting for the share
      probe_due = true;
      continue;
    }
    due = std::min(due, wait - idle_plans - 1);  // the plans before its probe
  }
  if (options_.explore_every > 0) {  // the next plan that explores is a full one
    const auto every = static_cast<uint64_t>(options_.explore_every);
    if (plans_ % every == 0 && waiting_extra >= 0) {
      // What waited here was this plan's extra node (with any due probes): the plans before the
      // next such plan retry only the probes, which cost less than it did.
      if (probe_due) return;
      waiting_extra = -1;
    }
    due = std::min(due, static_cast<int64_t>(every - plans_ % every) - 1);
  }
  // Past that plan the quiet plan is reused only while the share has no room for any exploration
  // (what comes due would wait, as in a full plan): at batch 64 some sequence's probe came due
  // every few plans, and full plans (~70 us there) were three in four.
  if (reusable <= 0 || (due <= 0 && !ExplorationShareUsedUp())) return;
  // Each reused plan relaxes the sequences' acceptance toward their drafters' averages
  // (idle_relaxation): reused only if the plan leaves them at 0 on the way there too, valued at
  // the better of each sequence's expected draft and its drafter's average (expected tokens grow
  // with acceptance).
  std::vector<AcceptanceModel::Tables> upper = ExpectedDrafts(candidates);
  if (base.chunks.tokens > 0) {
    for (int32_t b : Allocate(decodes, candidates, upper, StepLimit(decodes_seconds))) {
      if (b != 0) return;
    }
  }
  if (options_.idle_relaxation > 0) {
    bool better = false;
    for (size_t i = 0; i < candidates.size(); ++i) {
      const AcceptanceModel::Tables average =
          acceptance_.ExpectedDraft(candidates[i].drafter, kDrafterAverage, candidates[i].max_nodes,
                                    options_.acceptance_confidence);
      AcceptanceModel::Tables& t = upper[i];
      for (size_t k = 0; k < t.tokens.size() && k < average.tokens.size(); ++k) {
        if (average.tokens[k] > t.tokens[k]) {
          t.tokens[k] = average.tokens[k];
          better = true;
        }
        t.rows[k] = std::min(t.rows[k], average.rows[k]);
      }
    }
    if (better) {
      for (int32_t b : Allocate(decodes, candidates, upper, StepLimit(decodes_seconds))) {
        if (b != 0) return;
      }
    }
  }
  quiet_.candidates.reserve(candidates.size());
  for (const BudgetCandidate& c : candidates) {
    quiet_.candidates.emplace_back(c.id, c.drafter);
    if (std::find(quiet_.drafters.begin(), quiet_.drafters.end(), c.drafter) ==
        quiet_.drafters.end()) {
      quiet_.drafters.push_back(c.drafter);
    }
  }
  quiet_.decoding = base.decoding;
  quiet_.reusable = static_cast<int32_t>(reusable);
  quiet_.due_in = static_cast<int32_t>(std::max<int64_t>(due, 0));
  quiet_.planned = base.chunks.tokens == 0;  // else its predictions are the chunk step's
  quiet_.waiting_extra = waiting_extra;
  quiet_.decision = decision;
}

BudgetDecision DraftBudgetPolicy::PlanWithoutDrafting(
    const StepBase& base, const std::vector<BudgetCandidate>& candidates) {
  ++audited_plans_;
  if (quiet_.reusable > 0 || quiet_.reused > 0) EndQuietPlans();
  remeasure_second_plan_ = false;
  pending_exploration_ = {};
  drafted_last_plan_.clear();
  // Priced from PredictRecent's knots, not a refreshed fit: the fit is solved when read, and a
  // solve every step cost ~2 us at batch 1 on the CPU (see PredictRecent), where a reused quiet
  // plan costs nothing. Nothing drafts, so no node is priced (min_reach 0).
  return Undrafted(candidates.size(), PredictTarget(base.shape, /*recent=*/true) + other_seconds_,
                   base.decoding);
}

DraftBudgetPolicy::Audit* DraftBudgetPolicy::AuditOf(
    const std::vector<BudgetCandidate>& candidates) {
  // The drafters' names, sorted and each once: a batch holds one or a few.
  std::vector<const std::string*> names;
  for (const BudgetCandidate& c : candidates) {
    if (c.max_nodes <= 0) continue;
    if (std::none_of(names.begin(), names.end(),
                     [&](const std::string* n) { return *n == c.drafter; })) {
      names.push_back(&c.drafter);
    }
  }
  if (names.empty()) return current_;
  SetKey(names);
  // The plan prices drafted steps with these drafters' excess (none yet: 0).
  const auto excess = drafted_.find(audit_key_);
  excess_ = excess == drafted_.end() ? nullptr : &excess->second;
  if (!options_.audit.enabled) return nullptr;
  auto it = audits_.find(audit_key_);
  if (it == audits_.end()) it = audits_.try_emplace(audit_key_, options_.audit).first;
  current_ = &it->second;
  return current_;
}

BudgetDecision DraftBudgetPolicy::Plan(const StepBase& base,
                                       const std::vector<BudgetCandidate>& candidates) {
  BudgetDecision decision = PlanStep(base, candidates);
  planned_gap_ = {.planned = true,
                  .predicted = decision.predicted_seconds,
                  .no_draft = decision.no_draft_seconds,
                  .gaps = base.decoding,
                  .prompt_chunks = base.chunks.tokens > 0};
  return decision;
}

BudgetDecision DraftBudgetPolicy::PlanStep(const StepBase& base,
                                           const std::vector<BudgetCandidate>& candidates) {
  Audit* audit = AuditOf(candidates);
  audited_step_ = {
      .planned = true,
      .countable = base.chunks.tokens == 0 && base.decoding > 0 &&
                   std::any_of(candidates.begin(), candidates.end(),
                               [](const BudgetCandidate& c) { return c.max_nodes > 0; }),
      .decoding = base.decoding,
      .shape = base.shape,
      .audit = audit};
  if (audit != nullptr && !audit->audit.drafting() && target_cost_.observed() >= kAuditAfterSteps) {
    BudgetDecision decision = PlanWithoutDrafting(base, candidates);
    decision.quiet_steps = static_cast<int32_t>(
        std::min<int64_t>(audit->audit.UndraftedStepsAhead(), std::numeric_limits<int32_t>::max()));
    return decision;
  }
  if (base.max_nodes == 0) return PlanWithoutRoom(base, candidates);
  BudgetDecision reused;
  if (ReuseQuietPlan(base, candidates, &reused)) return reused;
  EndQuietPlans();
  ++plans_;
  const size_t n = candidates.size();
  // The re-measure's second plan (see remeasure_below_speedup), unless prompt chunks came.
  if (std::exchange(remeasure_second_plan_, false) && base.chunks.tokens == 0) {
    pending_exploration_ = {};
    return ZeroDecision(base, n);
  }
  BudgetDecision decision;
  decision.budgets.assign(n, 0);
  // Each candidate's expected tokens and rows at every budget, computed once per plan.
  const std::vector<AcceptanceModel::Tables> expected = ExpectedDrafts(candidates);
  std::tie(decision.no_draft_seconds, decision.no_draft_tokens) =
      Evaluate(base, candidates, expected, decision.budgets);

  // The most seconds a step with prompt chunks may take (infinity: no such bound).
  double prefill_limit = std::numeric_limits<double>::infinity();
  if (target_cost_.ready() && n > 0) {
    double step_limit = StepLimit(decision.no_draft_seconds);
    if (base.chunks.tokens > 0 && options_.max_prefill_step_increase >= 0) {
      // The prefill-step bound (see the header): what the decodes alone would take with their
      // drafts, or the step without drafts plus the allowed increase, whichever is longer.
      const StepBase decodes = WithoutChunks(base);
      const double decodes_seconds =
          Evaluate(decodes, candidates, expected, decision.budgets).first;
      const std::vector<int32_t> alone =
          Allocate(decodes, candidates, expected, StepLimit(decodes_seconds));
      prefill_limit = std::max(decision.no_draft_seconds * (1 + options_.max_prefill_step_increase),
                               Evaluate(decodes, candidates, expected, alone).first);
      step_limit = std::min(step_limit, prefill_limit);
    }
    decision.budgets = Allocate(base, candidates, expected, step_limit);
    if (RemeasuresTheStepWithoutDrafts(base, candidates, expected, decision)) {
      // Not an idle plan: no probe, trial or exploration (the step measures the shape alone), no
      // idle count or relaxation, and the sequences keep their hysteresis for the next plan.
      remeasured_at_plan_ = plans_;
      remeasure_second_plan_ = true;
      pending_exploration_ = {};
      return ZeroDecision(base, n);
    }
  }

  // Bounded exploration: probes for sequences left at 0, one extra node now and then, applied
  // only while their predicted cost stays within exploration_share of the planned time.
  const std::vector<int32_t> optimum = decision.budgets;
  std::vector<int32_t> explore = optimum;
  double explored = 0;
  int64_t room_left = base.max_nodes;  // probes stay within the step's token budget too
  if (room_left >= 0) {
    for (int32_t x : optimum) room_left -= x;
  }
  // Gives candidate i a probe's nodes (a probe, a trial's step, the extra node at 0) within the
  // room left; false when none fits.
  auto probe = [&](size_t i) {
    int32_t nodes = std::min(candidates[i].max_nodes, std::max(options_.probe_nodes, 1));
    if (room_left >= 0) nodes = static_cast<int32_t>(std::min<int64_t>(nodes, room_left));
    if (nodes <= 0) return false;
    if (room_left >= 0) room_left -= nodes;
    explore[i] = nodes;
    explored += nodes;
    return true;
  };
  std::vector<size_t> probed;
  std::vector<size_t> trials;   // sequences whose trial goes on if the plan explores
  std::vector<size_t> started;  // sequences whose trial starts (probes, and the extra node at 0)
  for (size_t i = 0; i < n; ++i) {
    int32_t& idle = idle_plans_[candidates[i].id];
    if (optimum[i] > 0) {
      idle = 0;
      trial_left_.erase(candidates[i].id);        // the optimum drafts it: no trial needed
      probe_backoff_[candidates[i].drafter] = 1;  // the drafter pays: probes as usual
      continue;
    }
    // A step with no room for drafts (prompt chunks fill its token budget) is not a plan that
    // left the sequence idle: counting it would probe every sequence at once when room opens.
    if (room_left == 0) continue;
    if (trial_left_.count(candidates[i].id) > 0 && probe(i)) {
      trials.push_back(i);
      continue;
    }
    if (options_.probe_after <= 0) continue;
    if (++idle < ProbeWait(candidates[i].drafter) || !probe(i)) continue;
    probed.push_back(i);
    started.push_back(i);
  }
  if (options_.explore_every > 0 && n > 0 &&
      plans_ % static_cast<uint64_t>(options_.explore_every) == 0) {
    // Any sequence, those at 0 included: while a drafter's probes back off, this one node now
    // and then is what brings a sequence whose acceptance estimate dipped back (at batch 1
    // without it adaptive n-gram fell from 0.98 to 0.87 of the best fixed budget).
    std::vector<size_t> room;
    for (size_t i = 0; i < n; ++i) {
      if (explore[i] < candidates[i].max_nodes) room.push_back(i);
    }
    if (!room.empty() && room_left != 0) {
      const size_t i = room[SplitMix(rng_) % room.size()];
      if (explore[i] > 0) {
        ++explore[i];
        explored += 1;
      } else if (probe(i)) {  // a sequence at 0: a trial's first step, as a probe
        started.push_back(i);
      }
    }
  }
  const auto [optimum_seconds, optimum_tokens] = Evaluate(base, candidates, expected, optimum);
  pending_exploration_ = {};
  double waiting_extra = -1;  // an exploration's extra seconds, when it waits for the share
  if (explored > 0) {
    // A drafter measured only a few times is explored whatever its calls cost so far
    // (DraftBudgetOptions::young_drafter_calls): its first calls are cold starts as often as not
    // (DrafterCostModel::Observe), and priced at them its probes would wait seconds for the share.
    bool young = options_.young_drafter_calls > 0;
    for (size_t i = 0; i < n && young; ++i) {
      if (explore[i] == optimum[i]) continue;
      const DrafterCostModel* model = drafter_cost(candidates[i].drafter);
      young = model != nullptr && model->calls() < options_.young_drafter_calls;
    }
    if (young && started.size() > 1) {
      // Outside the share, one new sequence per plan, the one idle longest: at a large batch each
      // such probe is one sequence's catch-up, not all of theirs at once. The others keep their
      // idle count and come next.
      const auto idle_of = [&](size_t i) { return idle_plans_[candidates[i].id]; };
      const size_t keep =
          *std::max_element(started.begin(), started.end(),
                            [&](size_t a, size_t b) { return idle_of(a) < idle_of(b); });
      for (size_t i : started) {
        if (i == keep) continue;
        explored -= explore[i] - optimum[i];
        explore[i] = optimum[i];
        probed.erase(std::remove(probed.begin(), probed.end(), i), probed.end());
      }
      started.assign(1, keep);
    }
    // Not bound by the step's own max_step_increase: a cost model that overestimates drafts
    // would otherwise never see one measured and never correct itself. The share bounds how
    // often it happens. But not past the streams' p99 gap either, once measured (ExplorationLimit):
    // the probes of a drafter that does not pay were that p99 (three processes at batch 1: ~0.8%
    // of a SpecFormer run's steps, 1.7 ms against a p99 of 1.3 ms without them). A step with
    // prompt chunks is not explored past its bound (decode-only steps measure the same drafts
    // without lengthening the longest gaps).
    const double explored_seconds = Evaluate(base, candidates, expected, explore).first;
    const double extra = std::max(0.0, explored_seconds - optimum_seconds);
    const double explore_limit = std::max(
        std::min(prefill_limit, ExplorationLimit(decision.no_draft_seconds)), optimum_seconds);
    const bool explores =
        (young || explored_seconds_ + extra <= options_.exploration_share * measured_seconds_) &&
        explored_seconds <= explore_limit;
    // Otherwise, the plan with only the trials under way.
    std::vector<int32_t> continued;
    double continued_seconds = 0;
    if (!explores && !trials.empty()) {
      continued = optimum;
      for (size_t i : trials) continued[i] = explore[i];
      continued_seconds = Evaluate(base, candidates, expected, continued).first;
    }
    if (explores) {
      explored_seconds_ += extra;
      // Observe charges what the step measures beyond the optimum's prediction, if more.
      pending_exploration_ = {.optimum_seconds = optimum_seconds, .charged_seconds = extra};
      decision.budgets = explore;
      for (size_t i : trials) {
        if (--trial_left_[candidates[i].id] <= 0) trial_left_.erase(candidates[i].id);
      }
      for (size_t i : started) {
        if (options_.trial_plans > 1) trial_left_[candidates[i].id] = options_.trial_plans - 1;
      }
      // The drafter's next probes wait twice as long (up to the cap; once per plan), until one
      // of its sequences drafts: a drafter that keeps not paying costs ever less of the share,
      // also through short requests that each would get their first probe.
      std::vector<std::string> backed_off;
      for (size_t i : probed) {
        idle_plans_[candidates[i].id] = 0;
        const std::string& drafter = candidates[i].drafter;
        if (std::find(backed_off.begin(), backed_off.end(), drafter) != backed_off.end()) continue;
        backed_off.push_back(drafter);
        auto [it, added] = probe_backoff_.try_emplace(drafter, 1);
        it->second = std::min(2 * it->second, std::max(options_.max_probe_backoff, 1));
      }
    } else if (!trials.empty() && continued_seconds <= explore_limit) {
      // A trial goes on past the share: its first step paid the catch-up (and used the share up),
      // and stopping now would leave its backlog to grow until the next one pays it again. Its
      // steps are still charged, so the next exploration waits for them. Not past the latency
      // bound on the p99 gap: a trial that no longer fits under it (the gaps got shorter) waits.
      explored = 0;
      for (size_t i : trials) {
        explored += explore[i];
        if (--trial_left_[candidates[i].id] <= 0) trial_left_.erase(candidates[i].id);
      }
      const double charged = std::max(0.0, continued_seconds - optimum_seconds);
      explored_seconds_ += charged;
      pending_exploration_ = {.optimum_seconds = optimum_seconds, .charged_seconds = charged};
      decision.budgets = continued;
    } else {
      explored = 0;  // waits (the idle counts keep growing) until the share and bound allow it
      if (explored_seconds <= explore_limit && !young) waiting_extra = extra;
    }
  }
  decision.explored_nodes = explored;
  for (size_t i = 0; i < n; ++i) {
    if (decision.budgets[i] > 0) {
      drafted_last_plan_.insert(candidates[i].id);
      continue;
    }
    drafted_last_plan_.erase(candidates[i].id);
    acceptance_.Relax(candidates[i].drafter, candidates[i].id,
                      candidates[i].max_nodes > 0 ? options_.idle_relaxation : 0);
  }

  // Reported at the estimates, not at the optimism the allocation used.
  std::vector<AcceptanceModel::Tables> estimate;
  if (options_.acceptance_confidence > 0) {
    for (size_t i = 0; i < n; ++i) {  // up to its budget: what Evaluate reads
      estimate.push_back(
          acceptance_.ExpectedDraft(candidates[i].drafter, candidates[i].id,
                                    std::min(decision.budgets[i], candidates[i].max_nodes)));
    }
  }
  StepShape shape;
  double rows = 0;
  std::tie(decision.predicted_seconds, decision.predicted_tokens) =
      Evaluate(base, candidates, options_.acceptance_confidence > 0 ? estimate : expected,
               decision.budgets, &shape, &rows);
  const double price =
      TokensPerSecondPrice(base, decision.predicted_seconds, decision.predicted_tokens);
  decision.min_reach = MinReach(shape, rows, price);
  decision.depth_reach.assign(n, 0.0);
  for (size_t i = 0; i < n; ++i) {
    if (decision.budgets[i] > 0) decision.depth_reach[i] = DepthReach(candidates[i].drafter, price);
  }
  KeepIfQuiet(base, candidates, decision, waiting_extra);
  return decision;
}

void DraftBudgetPolicy::Observe(const StepMeasurement& step) {
  double drafters_seconds = 0;
  for (const DrafterCall& call : step.drafter_calls) drafters_seconds += call.seconds;
  const double wall = step.target_seconds + drafters_seconds + std::max(0.0, step.other_seconds);
  if (std::exchange(planned_gap_.planned, false)) {
    int32_t accepted = 0;
    for (const StepMeasurement::Sequence& sequence : step.sequences) accepted += sequence.accepted;
    gap_tail_.Add(wall, planned_gap_.predicted, planned_gap_.no_draft, planned_gap_.gaps, accepted,
                  planned_gap_.prompt_chunks);
  }
  AuditStep(step, wall);
  const bool explored = pending_exploration_.charged_seconds > 0;
  // The step cost fit's prediction for this step's shape, before it learns from it: what the
  // steps around a drafter's call are measured against (the caches it evicted).
  const bool predictable = step.shape.tokens > 0 && target_cost_.ready();
  const double predicted_target = predictable ? PredictTarget(step.shape, /*recent=*/true) : 0.0;
  if (std::isfinite(wall) && wall > 0) {
    measured_seconds_ += wall;
    // Exploration is bounded by what it measurably cost: a probe whose catch-up took longer
    // than predicted uses up more of the share (and so do the steps after it, see aftermath_).
    if (explored) {
      const double measured_extra = wall - pending_exploration_.optimum_seconds;
      if (measured_extra > pending_exploration_.charged_seconds) {
        explored_seconds_ += measured_extra - pending_exploration_.charged_seconds;
      }
    }
  }
  pending_exploration_ = {};
  // A drafter's catch-up (a forward over a sequence's whole backlog) evicts the target's weights
  // from the caches: on the CPU the target's step with it ran 1.6x and the next one 1.4x their
  // shape's steady time (batch 1, 4-token steps: 1.58 and 1.42 ms against 0.99). Fed to the step
  // cost fit, those steps priced the drafted shapes that trials and resumptions visit right after
  // their catch-ups at ~1.3x, which kept them from paying. So both steps count as at most their
  // predicted time, and the catch-up step's excess is booked to the calls that caused it (their
  // per-observed-token cost then carries it); the next step's excess is dropped.
  int64_t caught_up_tokens = 0;  // observed by the calls that caught up
  for (const DrafterCall& call : step.drafter_calls) {
    if (CaughtUp(call)) caught_up_tokens += call.observed_tokens;
  }
  const bool caught_up = caught_up_tokens > 0;
  double target_seconds = step.target_seconds;
  double catch_up_excess = 0;
  if ((caught_up || after_catch_up_) && predictable && predicted_target > 0 &&
      target_seconds > predicted_target) {
    if (caught_up) catch_up_excess = target_seconds - predicted_target;
    target_seconds = predicted_target;
  }
  // What the step took beyond the models' prediction for it, if drafters ran (their calls aside),
  // before the models learn from it. Catch-up steps book their excess to the calls (above).
  int64_t draft_rows = 0;
  for (const StepMeasurement::Sequence& s : step.sequences) draft_rows += std::max(s.nodes, 0);
  const bool drafted = draft_rows > 0 || !step.drafter_calls.empty();
  // A step of decodes alone, against a price recent steps measured, measures how much slower the
  // steps after a draft run (a step with prompt chunks is priced less closely; against a stale
  // price, it may as well be the price that is wrong). See after_ratio_.
  const bool comparable = !drafted && predictable && predicted_target > 0 &&
                          step.shape.chunk_tokens == 0 && std::isfinite(step.target_seconds) &&
                          target_cost_.MeasuredRecently(step.shape.tokens);
  const double ratio =
      comparable ? std::min(step.target_seconds / predicted_target, kAftermathRatioCap) : 0.0;
  // A running mean over the first samples, a moving average at `rate` after.
  auto average = [&](double& mean, auto& samples, double rate) {
    ++samples;
    mean += std::max(rate, 1.0 / static_cast<double>(samples)) * (ratio - mean);
  };
  if (drafted) {
    CloseAftermath();  // the previous drafted step's window ends: this step's excess is its own
    since_drafted_ = 0;
    last_drafted_ = &DraftedOf(StepDrafters(step));
    exploration_window_ = explored;
    if (draft_rows > 0 && !caught_up && !after_catch_up_ && predictable && other_seen_ &&
        std::isfinite(step.other_seconds)) {
      const double predicted = predicted_target + other_seconds_;
      const double measured =
          WithoutOutlier(step.target_seconds + std::max(0.0, step.other_seconds),
                         predicted + ExcessOf(last_drafted_, static_cast<double>(draft_rows)));
      pending_sample_ = {.waiting = true,
                         .set = last_drafted_,
                         .rows = static_cast<double>(draft_rows) / kDraftRowUnit,
                         .excess = measured - predicted};
    }
  } else if (since_drafted_ < kAftermathSteps) {
    const int32_t k = since_drafted_++;
    if (comparable && last_drafted_ != nullptr) {
      average(last_drafted_->after_ratio[k], last_drafted_->after_samples[k], kAftermathRate);
      const double aftermath = AftermathSeconds(k, predicted_target);
      pending_sample_.aftermath += aftermath;
      if (exploration_window_) explored_seconds_ += std::max(0.0, aftermath);
    }
    // The step right after a drafted one stays out of the step cost fit above its price (its
    // excess is the drafted step's). Faster, the price was too high, and the fit learns it: held
    // at its price instead, a stale price of not drafting (the first steps of a run, 680 us
    // where undrafted steps took 470 at batch 1) was never corrected while drafting went on.
    if (k == 0 && predictable) target_seconds = std::min(target_seconds, predicted_target);
    if (since_drafted_ == kAftermathSteps) CloseAftermath();
  } else if (comparable) {
    average(far_ratio_, far_samples_, kFarRate);
  }
  after_catch_up_ = caught_up;
  if (step.shape.tokens > 0) {
    if (step.shape.chunk_tokens > 0 && std::isfinite(target_seconds) && target_cost_.ready()) {
      // What the chunks added beyond the decode part's price (0 without decodes), before the
      // fit learns this step.
      chunk_fit_.Add({1.0, static_cast<double>(step.shape.chunk_tokens) / kChunkRowUnit},
                     target_seconds - target_cost_.PredictRecent(DecodePart(step.shape)));
    }
    target_cost_.Observe(step.shape, target_seconds);
  }
  if (step.other_seconds >= 0 && std::isfinite(step.other_seconds)) {
    other_seconds_ = other_seen_ ? other_seconds_ + 0.1 * (step.other_seconds - other_seconds_)
                                 : step.other_seconds;
    other_seen_ = true;
  }
  for (DrafterCall call : step.drafter_calls) {
    if (catch_up_excess > 0 && CaughtUp(call)) {
      call.seconds += catch_up_excess * static_cast<double>(call.observed_tokens) /
                      static_cast<double>(caught_up_tokens);
    }
    if (drafter_cost_[call.drafter].Observe(call)) {
      // Its earlier calls were cold starts: what the probes paid for them was the warm-up's
      // cost, not the drafter's. Its probes start over at their usual pace and share.
      explored_seconds_ =
          std::min(explored_seconds_, options_.exploration_share * measured_seconds_);
      probe_backoff_[call.drafter] = 1;
    }
  }

  for (const StepMeasurement::Sequence& s : step.sequences) {
    if (s.asked > 0) acceptance_.ObserveSupply(s.drafter, s.id, s.asked, s.nodes);
    if (s.nodes > 0) {
      acceptance_.Observe(s.drafter, s.id, s.nodes, s.accepted, s.depth);
    } else {
      acceptance_.Relax(s.drafter, s.id, 0);  // asked, nothing came back: no draft, no streak
    }
  }
}

void DraftBudgetPolicy::AuditStep(const StepMeasurement& step, double wall) {
  const AuditedStep audited = std::exchange(audited_step_, {});
  if (!audited.planned || audited.audit == nullptr || target_cost_.observed() < kAuditAfterSteps) {
    return;
  }
  Audit& a = *audited.audit;
  if (!audited.countable) {
    a.audit.Skip();
    return;
  }
  // The yardstick is frozen for each pair of epochs (drafting_audit.h): taken at the first
  // counted step after the last pair ended, it prices the long epoch's next stretch, whose tail
  // is the next pair's window before its short epoch.
  if (a.prices_pair != a.audit.ended_pairs()) {
    a.prices = target_cost_.Snapshot();
    a.prices_pair = a.audit.ended_pairs();
  }
  double tokens = audited.decoding;
  for (const StepMeasurement::Sequence& s : step.sequences) tokens += std::max(s.accepted, 0);
  a.audit.Observe(wall, tokens, audited.decoding, a.prices.Predict(audited.shape));
}

void DraftBudgetPolicy::CloseAftermath() {
  // Evicted caches only slow the steps after: a window estimated faster is noise.
  if (pending_sample_.waiting) {
    pending_sample_.set->excess.Add(
        {1.0, pending_sample_.rows},
        pending_sample_.excess + std::max(0.0, pending_sample_.aftermath));
    // Before any plan (or a plan of other drafters), the accessor reads the set just taught.
    if (excess_ == nullptr) excess_ = pending_sample_.set;
  }
  pending_sample_ = {};
  exploration_window_ = false;
}

double DraftBudgetPolicy::AftermathSeconds(int32_t k, double predicted) const {
  if (last_drafted_ == nullptr || last_drafted_->after_samples[k] == 0) return 0;
  return (last_drafted_->after_ratio[k] - far_ratio_) * predicted;
}

double DraftBudgetPolicy::SpareTokens(const StepShape& base, double tolerance) const {
  if (!target_cost_.ready()) return 0;
  const double limit = (1.0 + tolerance) * PredictTarget(base);
  auto fits = [&](int64_t extra) {
    StepShape s = base;
    s.tokens += extra;
    return PredictTarget(s) <= limit;
  };
  // Predict is monotone in tokens: binary search the largest extra that fits.
  int64_t lo = 0, hi = 1;
  while (hi <= 8192 && fits(hi)) {
    lo = hi;
    hi *= 2;
  }
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return static_cast<double>(lo);
}

void DraftBudgetPolicy::Forget(int64_t id) {
  acceptance_.Forget(id);
  idle_plans_.erase(id);
  trial_left_.erase(id);
  drafted_last_plan_.erase(id);
}

}  // namespace specula
