// The adaptive draft budget: every step, how many draft tree nodes each running sequence gets,
// chosen from measured costs and acceptance so that the step produces the most tokens per second
// of the whole batch. 0 nodes (no speculation for the step) is always an option, so speculation
// is used only where the measured spare compute pays for it. Torch-free: the router (which links
// no LibTorch) and the in-process engine driver use the same policy.
//
// Three online models, all fed by measured steps (DraftBudgetPolicy::Observe):
//   - StepCostModel: the target step's seconds as a function of its shape (tokens in the forward,
//     attention work = sum over sequences of new rows x context), piecewise linear in tokens
//     between log-spaced knots plus a linear attention term; recursive least squares with
//     forgetting, so it follows drift (other load on the machine) within a few dozen steps. A
//     knot no recent step visited is kept within what the recently visited ones imply (cost
//     non-decreasing in tokens, cost per token non-increasing), so a warm-up's cold steps or a
//     load since gone do not price the shapes that only drafts would visit. A step that also
//     prefills prompt chunks is priced as its other rows at these prices plus what its chunks
//     add, per step and per chunk row, fitted apart (DraftBudgetPolicy::chunk_fit_): a prompt
//     row needs no logits and costs a fraction of a decode or draft row.
//   - DrafterCostModel: one drafter call's seconds as a function of sequences, nodes, depth and
//     observed (caught-up) tokens; a non-autoregressive drafter fits ~0 per depth, an
//     autoregressive one pays per depth.
//   - AcceptanceModel: per drafter and sequence, p[j] = P(the j-th token of a draft is accepted |
//     the j-1 before it were, the draft had at least j nodes), an exponential moving average over
//     recent steps (a new sequence starts from its drafter's average). A tree's nodes count as
//     positions whatever its shape: a 4-node tree of depth 1 that kept one token has positions 1
//     (accepted) and 2 (not), so a budget is valued at what drafts of that size brought back
//     (valued as depth instead, a wide tree's nodes were priced as a chain's and the planner
//     asked for trees whose extra nodes added width, not tokens). Likewise the drafter's supply
//     s[j] = P(node j comes back | node j-1 did and j was asked for): a drafter may return fewer
//     nodes than its budget (n-gram lookup finds no match, or a shorter one). The plan values
//     p[1] at its upper confidence bound (DraftBudgetOptions::acceptance_confidence), so a
//     drafter's first unlucky steps do not keep it off. A budget of n nodes is expected to add
//     E(n) = sum_{j<=n} S(j) A(j) tokens and R(n) = sum_{j<=n} S(j) rows to the forward, with
//     S(j) = prod_{i<=j} s[i] and A(j) = prod_{i<=j} p[i]; the drafter's per-call and
//     per-sequence costs are paid whatever comes back, so a drafter that often returns nothing
//     (over a network round trip, say) is asked less.
//
// Catch-up is an investment, not a per-step cost: a sequence whose drafter has not seen its last
// U tokens (its prompt, or what it generated while at budget 0) pays for observing them once,
// after which each drafting step observes only what the previous one committed. The plan charges
// the steady part (what a drafting step observes: its expected accepted tokens plus one) to the
// step and spreads the rest over the steps the sequence can still draft (its tokens left, at most
// kCatchUpHorizon): charged whole, a backlog that grows while the sequence does not draft would
// keep it from ever drafting again. For the same reason the drafter cost fit's units make a
// call's unexplained seconds go first to the tokens it observed, not to a per-call constant that
// every later step would pay. A catch-up also evicts the target's weights from the caches: the
// step it ran in and the next one count in the step cost fit at most as predicted, and the
// excess of the first is booked to the catch-up's call. What the other drafted steps take beyond
// the step cost fit and the mean overhead (a drafter on the same cores, knots that only drafts
// visit) is fitted per drafted step and per draft row, and added to every plan with drafts;
// the undrafted step right after a drafted one counts in it too (the drafter's call evicted the
// target's weights from the caches), and not in the step cost fit.
//
// Decision (Plan): start from no drafts. Then greedy marginal allocation (within the latency
// bound, DraftBudgetOptions::max_step_increase, when one is set: on the streams' p99 gap, from
// the planned steps' measured tail, step_gap_tail.h): repeatedly add the node
// (or, for a sequence not drafting yet, the best first bundle of nodes, which pays the
// per-sequence drafter cost) with the most expected tokens per added second, while that beats the
// batch's decoding rate R = Y/T by the margin (DraftBudgetOptions::node_margin), Y the expected
// tokens so far and T the predicted seconds without the step's prompt chunks (work the step does
// anyway: counted in T, a long chunk would make any draft look cheap). A drafter's per-call cost is
// charged once when any of its sequences drafts, and the drafter is left off when the step's
// decoding rate is higher without it. A step that prefills prompt chunks is bounded as well
// (DraftBudgetOptions::max_prefill_step_increase): its gap is the longest its decoding sequences
// see, so drafts may not make it much longer than without them, unless its decodes alone would take
// that long with their drafts; a draft row in it is priced at least as one of its prompt rows.
//
// Worked example (batch of 1, verification free up to 8 tokens, a chain drafter with p = 0.8 at
// every depth, drafting 0.2 ms per call and 0.05 ms per node, the step 5 ms): one node adds
// 0.8 tokens for 0.25 ms (3.2 tokens/ms > 1/5), the 2nd adds 0.64 for 0.05 ms, ... the 7th adds
// 0.21 for 0.05 ms: all 7 are taken (the 8th token of the forward is the pending one). Tokens
// get expensive past the knee: at 64 sequences and 2 ms per extra 64 tokens, only sequences whose
// acceptance makes 0.8^d / (0.03 ms) beat R keep drafting, and a sequence with p = 0.2 gets 0.
//
// Exploration (bounded, deterministic): a sequence whose budget was 0 for `probe_after` plans in a
// row (times its drafter's backoff: doubled by each plan that probes the drafter, up to
// `max_probe_backoff`, and reset when one of its sequences drafts) gets a probe of `probe_nodes`
// nodes (so a drafter whose acceptance was once low is re-measured), and every
// `explore_every`-th plan one sequence gets one node past the optimum (so the cost curve is
// measured around the operating point; a sequence at 0 that it picks gets a probe's nodes). A
// probe of a sequence at 0 is a trial: it drafts for `trial_plans` plans, the first paying the
// catch-up and the rest measuring what that step cannot. All of it is capped by the requests'
// own limits, and its cost by `exploration_share` (1%) of the measured time of all steps (each
// exploration is charged its predicted cost, or what its step measured beyond the prediction
// without it, whichever is more, and what the undrafted steps after it are measured to take
// longer on the caches its drafts evicted; a trial that has started goes on and is charged): an
// expensive drafter (whose catch-up Observe costs more than a step) is probed rarely. Between
// probes, an idle sequence's acceptance estimate relaxes toward its drafter's average, so a paying
// drafter resumes after a dip without waiting for one.
//
// Quiet plans: a plan that leaves every sequence at 0 with nothing to explore is reused by the
// next plans (up to `quiet_replan_every` - 1 of them) until a probe, an extra node or a share that
// now allows a waiting probe is due; their idle counts and relaxation are applied before the next
// full plan, so probes come when they would. A reusing batch may differ from the planned one by
// up to 1/8 of its sequences, all of the plan's drafters (none of which paid even at its
// drafter's average acceptance, where a joining sequence starts), and may carry prompt chunks
// (they make draft rows no cheaper); its predictions are its own step's. Between full plans only
// the models' drift (the target's cost, the relaxation) could start a draft, at most that many
// plans late. Where no drafter pays (learned drafters at batch 1 and 4 on the CPU)
// planning every step took 1.7% (batch 1) and 5.2% (batch 4) of the engine thread (perf; ~8 us
// of a 0.46 ms step at batch 1, most of it cache misses after the forward); with quiet plans
// 0.6% and 1.6%.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/spec/drafting_audit.h"
#include "common/spec/step_gap_tail.h"

namespace specula {

struct DrafterIndex;  // a plan's drafters (draft_budget.cc)

// Linear least squares y ~ theta . x, fitted online with exponential forgetting and anchored to a
// prior: A = lambda A + (1 - lambda) w I + x x^T, b = lambda b + (1 - lambda) w prior + x y. The
// prior keeps directions that recent samples do not excite from winding up; with lambda < 1 the
// fit follows the last ~1/(1 - lambda) samples.
class ForgettingLeastSquares {
 public:
  ForgettingLeastSquares(std::vector<double> prior, double prior_weight, double forgetting);

  void Add(const std::vector<double>& x, double y);
  double Predict(std::span<const double> x) const;
  // Replaces the prior and restarts the fit from it.
  void Reset(std::vector<double> prior);
  // Moves the anchor that future forgetting pulls toward, keeping the data.
  void SetAnchor(std::vector<double> anchor) { prior_ = std::move(anchor); }
  // Coefficients the solution keeps at 0 or above (at most kMaxNonNegative): the least squares
  // fit under that constraint, not the free fit clamped afterwards (clamped, a coefficient the
  // data drove negative leaves the others fitted to cancel it).
  void SetNonNegative(std::vector<size_t> indices);
  static constexpr size_t kMaxNonNegative = 4;
  // Solved when read (Add only accumulates: the engine observes every step, and reads the fit
  // once per plan).
  const std::vector<double>& coefficients() const {
    Solve();
    return theta_;
  }
  int64_t samples() const { return samples_; }

 private:
  // theta_ from A and b, if a sample came since the last solve.
  void Solve() const;
  // Solves A theta = b with the coefficients nonnegative_[c] for the bits c of zero_mask held
  // at 0; false if the matrix is numerically singular.
  bool SolveWith(uint32_t zero_mask, std::vector<double>& theta) const;
  // theta^T A theta - 2 b^T theta: the fit's squared error up to a constant.
  double Objective(const std::vector<double>& theta) const;

  size_t n_;
  double prior_weight_;
  double forgetting_;
  std::vector<double> prior_;
  std::vector<double> a_;  // n x n, row-major
  std::vector<double> b_;
  mutable std::vector<double> theta_;
  // Solve's Cholesky factor and forward-substitution, kept between solves (no allocation: the
  // step cost fit is solved once per full plan).
  mutable std::vector<double> l_, z_;
  mutable bool solved_ = true;
  int64_t samples_ = 0;
  std::vector<size_t> nonnegative_;
  mutable std::vector<double> candidate_;  // a solve's solution before it is taken (no allocation)
};

// The shape of a target step that its cost depends on.
struct StepShape {
  int64_t tokens = 0;          // rows in the forward (pending tokens, draft nodes, prompt chunks)
  double attention = 0;        // sum over sequences of (new rows x context length after the step)
  int64_t chunk_tokens = 0;    // of `tokens`, prompt-chunk rows (0: a decode-only step)
  double chunk_attention = 0;  // of `attention`, the prompt chunks' (0: not known)
};

class StepCostModel {
 public:
  explicit StepCostModel(double forgetting = 0.97);

  // Seeds the fit with measured (shape, seconds) points, e.g. `specula bench-forward`'s curve.
  void WarmStart(const std::vector<std::pair<StepShape, double>>& points);
  void Observe(const StepShape& shape, double seconds);
  // Predicted seconds (0 before any observation). Non-decreasing in tokens and attention.
  double Predict(const StepShape& shape) const;
  // Predict in two parts, for callers that predict many shapes of a few token counts (the
  // allocation: up to 16 bundles per sequence per plan): Predict(shape) ==
  // PredictWith(KnotPart(shape.tokens), shape), bit for bit, once ready() and shape.tokens > 0.
  double KnotPart(int64_t tokens) const;
  double PredictWith(double knot_part, const StepShape& shape) const;
  // Predict from knots refreshed at most kOutlierRefreshEvery observations ago: what a measured
  // step is compared to (Observe's outlier bound, the policy's excess over prediction). Refreshing
  // the knots every step for it cost 2 us a step at batch 1 on the CPU (a 15 x 15 solve and the
  // stale knots' bounds), 0.5% of a 0.4 ms step. Its knots are a copy taken on that schedule, so
  // that what it returns depends on the observations alone, not on when plans predicted.
  double PredictRecent(const StepShape& shape) const;
  bool ready() const { return observed_ > 0; }
  // Whether recent steps measured the knots a step of `tokens` tokens is priced from (those it
  // interpolates between with a nonzero weight): false once they are stale, i.e. their price is
  // held or inferred from other shapes, not measured.
  bool MeasuredRecently(int64_t tokens) const;
  // Whether the knots a step of `tokens` tokens is priced from carry at least `steps` times the
  // weight one step of that shape puts on each, counted up to half a step (kVisited): with
  // steps = 1, one step of the shape, and false while its price is the first guess (a roofline
  // scaled from the first step, often a prompt's prefill) or inferred from other shapes; with
  // more, steps / 2 steps of a knot's own size, `steps` steps of a size between two knots.
  bool Visited(int64_t tokens, double steps = 1) const;
  int64_t observed() const { return observed_; }

  // The fit as refreshed into prices: a step's seconds at each knot, per attention unit, and
  // for a prompt chunk.
  struct Prices {
    std::vector<double> knots;
    double per_attention = 0;
    // What a step with a prompt chunk costs beyond its rows (the chunk's first-token sampling,
    // the caches the prefill left cold): fitted apart, so that the few short steps that end a
    // prompt do not price the knots that drafts use.
    double chunk_step = 0;
    double KnotPart(int64_t tokens) const;
    double Predict(double knot_part, const StepShape& shape) const;
    // 0 without knots (a default Prices) or tokens.
    double Predict(const StepShape& shape) const;
  };
  // A copy of the current prices, which later observations do not move (a yardstick: the
  // drafting audit's).
  Prices Snapshot() const;

  static const std::vector<int64_t>& Knots();
  static constexpr std::array<int64_t, 13> kKnotTokens = {1,   2,   4,   8,    16,   32,  64,
                                                          128, 256, 512, 1024, 2048, 4096};
  static constexpr size_t kKnotCount = kKnotTokens.size();  // Knots().size()
  // An observed step counts as at most this many times its predicted seconds (see Observe).
  static constexpr double kOutlierFactor = 1.5;

 private:
  std::vector<double> Features(const StepShape& shape) const;
  // Caches the fit's knots, the attention coefficient and the chunk-step cost, for Predict:
  // each knot no recent step visited kept within what the recently visited ones imply (ClampStale),
  // then all made monotone. Done when a prediction needs them after new observations (the
  // policy predicts once per plan, and reuses quiet plans), and by Observe's outlier bound when
  // they are kOutlierRefreshEvery observations old.
  void RefreshKnots() const;
  void EnsureKnots() const {
    if (knots_observed_ != observed_) RefreshKnots();
  }
  static constexpr int64_t kOutlierRefreshEvery = 8;
  // A knot that the fit's memory still holds steps on (its recent visits, forgotten at the fit's
  // rate, weigh at least half a step).
  bool Fresh(size_t knot) const;
  // Keeps each stale knot within what the fresh knots say it may cost, with a step's cost
  // non-decreasing in tokens and its cost per token non-increasing (a fixed part, then rows): at
  // least the fresh knot below it and its share of the one above, at most the one above and the
  // one below scaled by tokens. Steps long ago (a warm-up's cold caches, a load since gone) must
  // not price shapes today's steps only probe: a stale knot held at 4x its neighbour kept drafts
  // off at batch 4.
  void ClampStale(std::span<double> knots) const;
  // A knot counts as visited (Anchor, Visited) once steps put half a step's weight on it.
  static constexpr double kVisited = 0.5;
  // A knot is fresh while its recent visits weigh at least this much.
  static constexpr double kFreshVisits = 0.5;
  // How fast a stale knot's prediction relaxes (RelaxStale): the exponent on its recent visits'
  // weight over kFreshVisits.
  static constexpr double kStaleDecay = 1.0 / 32;
  // Relaxes each stale knot's prediction from the value it holds toward the least the fresh
  // knots allow, as its last visits recede (its excess halves every ~740 steps at the default
  // forgetting): what a shape cost long ago (a cold warm-up, a burst of load on the machine
  // since gone) says less and less about what it costs now. Held there, a knot that only drafts
  // visit priced them out for good: no draft, no visit, no correction (at batch 1 on the CPU the
  // 4-token knot stayed at 4x the 1-token one, 2.7 ms for a 1.0 ms step, through thousands of
  // steps and kept a paying drafter off). Relaxed, the drafts return once the knot's excess has
  // decayed and re-measure it; where they do not pay, that costs one re-measuring step every
  // thousand or so. Slow, so that shapes visited now and then (a prompt's prefill) keep their
  // price between visits; not after a warm start (a measured curve is the anchor). Applied to
  // the prediction, not to the fit's anchor.
  void RelaxStale(std::span<double> knots) const;
  // The anchor that the fit's knots fall back to: a knot that steps visited keeps its fitted
  // cost; one no step visited yet is interpolated between the visited ones (the chord: never
  // cheaper than a convex cost curve, so drafts are not made to look free; linear in tokens past
  // the last, the first guess's shape before the first), so a shape only drafts would visit is
  // not priced from the first step alone (a prefill).
  std::vector<double> Anchor() const;

  ForgettingLeastSquares fit_;
  mutable Prices prices_;
  mutable int64_t knots_observed_ = -1;  // observed_ when prices_ were refreshed
  // PredictRecent's copy of prices_, and observed_ when it was taken.
  mutable Prices recent_;
  mutable int64_t recent_observed_ = -1;
  bool has_prior_ = false;
  bool warm_started_ = false;  // a measured curve anchors every knot: kept as the anchor
  double forgetting_;
  std::vector<double> visits_;         // per knot: the observed steps' weight on it, summed
  std::vector<double> recent_visits_;  // the same, forgotten at the fit's rate
  int64_t observed_ = 0;
};

// One drafter call as measured: Propose for its drafting sequences plus the Observe that caught
// them up.
struct DrafterCall {
  std::string drafter;
  int32_t sequences = 0;        // sequences proposed for
  int64_t nodes = 0;            // tree nodes returned, all sequences
  int32_t max_depth = 0;        // deepest tree
  int64_t observed_tokens = 0;  // tokens observed for these sequences before proposing
  double seconds = 0;
};

class DrafterCostModel {
 public:
  explicit DrafterCostModel(double forgetting = 0.95);
  // True when the call restarted a young fit that it undercut many times over (the calls before
  // it were cold starts).
  bool Observe(const DrafterCall& call);
  // Seconds of one call of this shape (at least 0; 0 without sequences).
  double Predict(int32_t sequences, int64_t nodes, int32_t max_depth, double observed_tokens) const;
  // The fitted parts: per call, per sequence, per node, per depth, per observed token.
  struct Parts {
    double per_call = 0, per_sequence = 0, per_node = 0, per_depth = 0, per_observed = 0;
  };
  Parts parts() const;
  bool ready() const { return fit_.samples() > 0; }
  // Calls in the fit (since its last restart).
  int64_t calls() const { return fit_.samples(); }

 private:
  ForgettingLeastSquares fit_;
};

class AcceptanceModel {
 public:
  static constexpr int32_t kMaxDepth = 64;
  // rate: EMA weight of a sequence's newest step; prior_rate: of the drafter's average.
  // streaks: whether a continuing sequence's estimate is moved by its streak (below).
  explicit AcceptanceModel(double rate = 0.1, double prior_rate = 0.05, double initial = 0.5,
                           bool streaks = true);

  // A step of sequence `id`: a draft of `nodes` nodes and `depth` levels (0: a chain, depth =
  // nodes) was verified and `accepted` of them kept. It also sets the sequence's streak (below).
  void Observe(const std::string& drafter, int64_t id, int32_t nodes, int32_t accepted,
               int32_t depth = 0);
  void Forget(int64_t id);
  // P(the d-th token accepted | the d-1 before it were), d >= 1: the sequence's average over its
  // drafted steps, whatever their streak.
  double Conditional(const std::string& drafter, int64_t id, int32_t d) const;
  // Expected accepted tokens of a chain of `nodes` nodes, all of them drafted, in the sequence's
  // current streak (what ExpectedDraft values).
  double Expected(const std::string& drafter, int64_t id, int32_t nodes) const;

  // Acceptance runs in streaks: where the text is predictable a draft is accepted whole, and the
  // next one is likely to be too. What a sequence's last step did predicts its next draft (the
  // thirty-second session's traces, batch 1: P(first token accepted) after a draft kept to its
  // full depth 0.87 for SpecFormer and 0.77 for n-gram, after one kept in part 0.77 / 0.70, after
  // one rejected at its first token 0.48 / 0.40), while the per-sequence average weighs a step a
  // tenth and follows a streak only after it has ended. So each drafter also measures, per streak
  // and depth, how far its drafts' outcomes were from their sequences' estimates before the step
  // whose streak it is (so that neither which sequences a streak holds, good or bad, nor how the
  // average moved with that step counts as what the streak does), and a continuing sequence is
  // valued at that estimate moved by its streak's shift (the measured mean, less one standard
  // error toward 0). Whether a sequence keeps drafting after a rejection is the plan's
  // hysteresis (DraftBudgetOptions::margin_hysteresis), not a bias in the estimate. A sequence
  // that did not draft at its last step has no streak: a draft that starts a run is valued at
  // its average. The drafter's supply (below) is streaked the same way: an n-gram match is long
  // where the text repeats (after a draft kept whole the n-gram drafter returned 6.0 nodes of ~12
  // asked, after an undrafted step 1.0).
  enum class Streak : uint8_t { kNone, kRejected, kPartial, kFull };
  Streak StreakOf(int64_t id) const;
  // How much a streak adds to a sequence's P(depth d accepted | d-1) (< 0: takes away), as
  // measured for the drafter; 0 for kNone or before it is measured.
  double StreakShift(const std::string& drafter, Streak streak, int32_t d) const;
  // StreakShift at d = 1..positions, with one lookup of the drafter's tables (for metrics, every
  // step).
  std::vector<double> StreakShifts(const std::string& drafter, Streak streak,
                                   int32_t positions) const;
  // The same for its supply, P(node j comes back | j-1 did).
  double SupplyStreakShift(const std::string& drafter, Streak streak, int32_t j) const;
  // The drafter's average P(depth d accepted | d-1), for metrics.
  double DrafterConditional(const std::string& drafter, int32_t d) const;

  // A step in which sequence `id` did not draft: its streak ends, and its estimates move `weight`
  // of the way toward its drafter's average, as a step at the average would move them. Acceptance
  // drifts along a sequence (a request's first tokens after its prompt are drafted worse than its
  // later ones), and a sequence that stops drafting is measured no more: without this, a dip that
  // stopped it would be its estimate for the rest of the request, however well its drafter does
  // elsewhere.
  void Relax(const std::string& drafter, int64_t id, double weight);
  // A step of sequence `id` asked its drafter for `asked` nodes and `returned` came back (before
  // the step's Observe, which moves the sequence to its next streak).
  void ObserveSupply(const std::string& drafter, int64_t id, int32_t asked, int32_t returned);
  // P(node j comes back | node j-1 did, j asked for), j >= 1 (1 until measured).
  double Supply(const std::string& drafter, int64_t id, int32_t j) const;
  // The drafter's average of it, for metrics.
  double DrafterSupply(const std::string& drafter, int32_t j) const;
  // What a budget of n = 0..max_nodes nodes is expected to add: tokens E(n) and forward rows R(n)
  // (see the header's comment), in one pass (the policy's inner loop). With confidence > 0, p[1]
  // is raised by that many standard errors of its drafter's average (an upper confidence bound
  // that shrinks as the drafter's samples grow).
  struct Tables {
    std::vector<double> tokens, rows;
  };
  Tables ExpectedDraft(const std::string& drafter, int64_t id, int32_t max_nodes,
                       double confidence = 0) const;
  // The standard error of the drafter's average p[d]: sqrt(p (1 - p) / n), n its samples there
  // plus the initial value's weight.
  double DrafterStandardError(const std::string& drafter, int32_t d) const;

 private:
  // One EMA per depth, per drafter (its average, the start of its new sequences) and sequence.
  struct Rates {
    std::map<std::string, std::vector<double>> prior;
    std::map<std::string, std::vector<int64_t>> prior_samples;  // per drafter and depth
    std::unordered_map<int64_t, std::vector<double>> seq;
    std::vector<double> initial;
    const std::vector<double>& Of(const std::string& drafter, int64_t id) const;
    const std::vector<double>& Prior(const std::string& drafter) const;
    // Depths 1..last observed: depth d hit iff d <= hits.
    void Update(const std::string& drafter, int64_t id, int32_t last, int32_t hits, double rate,
                double prior_rate);
    void Relax(const std::string& drafter, int64_t id, double weight);
  };

  // A drafter's drafts in one streak, per depth: the mean and mean square of their outcomes (1
  // accepted or came back, 0 not) less their sequences' estimates, and the shift used (the mean
  // less one standard error toward 0).
  struct StreakRates {
    std::vector<double> mean, square, shift;
    std::vector<int64_t> samples;
    // Depths 1..last were in question, depth d a success iff d <= hits; `own` the sequence's
    // estimates before it.
    void Learn(const std::vector<double>& own, int32_t last, int32_t hits);
  };
  static constexpr size_t kStreaks = 3;  // kRejected, kPartial, kFull
  struct Streaks {
    std::array<StreakRates, kStreaks> accept, supply;
  };
  // The drafter's table for a streak, or nullptr (kNone, or not measured yet).
  const StreakRates* StreakTable(const std::string& drafter, Streak streak, bool supply) const;

  double rate_, prior_rate_;
  bool streaks_;
  Rates accept_;
  Rates supply_;
  // A sequence's streak, and its estimates before its last step's outcome (empty: not observed
  // at that step).
  struct SequenceStreak {
    Streak streak = Streak::kNone;
    std::vector<double> accept_before, supply_before;
    bool supply_fresh = false;  // supply_before is this step's (ObserveSupply before Observe)
  };
  std::unordered_map<int64_t, SequenceStreak> streak_;  // absent: kNone
  // What a sequence is valued at in its streak: its estimates before its last step, moved by the
  // streak's shifts (nullptr: its current estimates, unmoved).
  struct InStreak {
    const std::vector<double>* accept = nullptr;
    const std::vector<double>* accept_shift = nullptr;
    const std::vector<double>* supply = nullptr;
    const std::vector<double>* supply_shift = nullptr;
  };
  InStreak Streaked(const std::string& drafter, int64_t id) const;
  std::map<std::string, Streaks> streak_rates_;
};

struct DraftBudgetOptions {
  // A sequence at budget 0 this many plans in a row is probed with probe_nodes (0 = never; a probe
  // has at least one node).
  int32_t probe_after = 32;
  int32_t probe_nodes = 2;
  // Each plan that probes a drafter doubles the wait for its next probes, up to this factor
  // (1 = no backoff); a plan where one of its sequences drafts resets it. Bounds what a drafter
  // that does not pay costs (short requests would each get a probe) and still re-measures it
  // every probe_after x max_probe_backoff plans of a sequence.
  int32_t max_probe_backoff = 8;
  // Every explore_every-th plan, one sequence gets one node past the optimum (0 = never); one at
  // 0 nodes gets probe_nodes and starts a trial, as a probe does.
  int32_t explore_every = 16;
  // An exploration that drafts for a sequence at 0 nodes (a probe, or the extra node) is a trial:
  // the sequence drafts probe_nodes nodes for this many plans in all (unless the optimum gives it
  // more), charged to the exploration share like any exploration. Its first step pays the
  // drafter's catch-up on everything the sequence generated undrafted; the steady steps after it
  // measure what that step cannot: the deeper positions' acceptance, the drafter's steady call
  // (a fit of catch-up calls alone cannot tell their per-call part from their per-token part)
  // and the forward at the drafted size. With one step per exploration those three stayed at
  // their initial or cold-start values for whole runs and kept a drafter that pays at batch 1
  // off (the self-distilled draft LM on the CPU: 0.94x of no speculation where k = 3 ran at
  // 1.18-1.29x). 1: single-step probes.
  int32_t trial_plans = 4;
  // Exploration (probes and extra nodes) may cost at most this share of the measured steps'
  // time; what does not fit waits.
  double exploration_share = 0.01;
  // A drafter whose cost fit holds fewer calls than this (since its last cold-start restart,
  // DrafterCostModel::Observe) is probed whether or not exploration_share has room (its probes
  // are still charged to it), one newly probed sequence per plan: its first calls are cold
  // starts as often as not (on a GPU each kernel's first launch), and priced at them its probes
  // came seconds apart. 0: never.
  int32_t young_drafter_calls = 16;
  // The latency bound: drafts may make a step take at most (1 + max_step_increase) times its
  // predicted time without them. Streamed chunks are a step apart, so this bounds what drafting
  // adds to inter-token latency (p99 ITL) at the price of throughput where verification is not
  // free. Exploration (within exploration_share) is exempt from the step's own bound, so that
  // the cost of the drafts the bound forbids is still measured (but see bound_by_gap_tail).
  // < 0: no bound (tokens per second alone decide).
  double max_step_increase = -1;
  // With the bound: a step may also take as long as keeps the streams' p99 gap within
  // (1 + max_step_increase) of what it is without drafts, measured (step_gap_tail.h): its plan
  // plus the p99.9 of how much longer than planned steps run, at most (1 + max_step_increase) times
  // the p99 gap without drafts. The bound is on the p99 gap, and where that gap is set by jitter
  // or by prefill steps rather than by the decode step itself, drafts fit under it. Exploration
  // is bound by it too, once the gaps are measured: at most (1 + max_step_increase) times the p99
  // gap (rare steps: no room for their own overrun). false: the step's own time alone, and
  // exploration exempt.
  bool bound_by_gap_tail = true;
  // The prefill-step bound: a step that also prefills prompt chunks is already the longest gap
  // in its decoding sequences' streams (under load these steps set the p99 inter-token latency),
  // so drafts may make it take at most the longer of (1 + max_prefill_step_increase) times its
  // time without drafts and the time its decodes alone would take with their drafts. A short
  // chunk thus drafts as a decode-only step would; a long one is not made longer. < 0: no bound.
  double max_prefill_step_increase = 0.05;
  // The first draft token's acceptance is valued at its upper confidence bound, the estimate
  // plus this many standard errors of the drafter's average (DrafterStandardError), so that a
  // drafter with few samples keeps drafting until they tell whether it pays: a few unlucky
  // early steps (a drafter's first, short request) would otherwise leave it undrafted, with only
  // rare probes to raise it. The bonus shrinks as 1/sqrt(samples): a drafter that does not pay
  // stops within a few dozen steps at batch 1, within a few steps at large batches. Only p[1]:
  // whether a drafter pays at all is mostly its first token, and a bonus at every position
  // would compound into deep drafts whose positions were never measured. 0: the estimate alone.
  // One standard error since trials, idle relaxation and the margin's hysteresis (below) also
  // bring a dipped drafter back: with two, a drafter that never pays (p = 0.3 in the closed-loop
  // test) kept drafting a tenth of its steps at the bonus's break-even.
  double acceptance_confidence = 1.0;
  // Each plan that leaves a sequence at 0 nodes moves its acceptance estimates this much of the
  // way back toward its drafter's average (AcceptanceModel::Relax), so that a sequence whose
  // drafts were rejected a few times in a row resumes after a few steps if its drafter pays on
  // average (at batch 1 on the CPU the self-distilled draft LM stopped for good after such a dip
  // and ran at 1.05x where k = 3 ran at 1.24x), while a drafter whose average does not pay stays
  // off. The same weight as a measured step's (the per-sequence EMA rate, 0.1): a step without a
  // draft counts as a step at the average. 0: an idle sequence keeps its last estimate.
  double idle_relaxation = 0.1;
  // Each plan prices a forward row in tokens (BudgetDecision::min_reach) for drafters that can
  // estimate how likely each of their nodes is to be reached (the n-gram drafter, by the length
  // of its match): they leave out the nodes not worth their verification. The budget stays the
  // most nodes; off: every node proposed within it is verified.
  bool prune_by_reach = true;
  // A node is added only if its expected tokens per added second beat the batch's decoding rate
  // by this fraction (and a pruning drafter's row price is raised by it), except a sequence's
  // first nodes while it drafted at the last plan (hysteresis: it goes on while drafting breaks
  // even, since stopping costs a catch-up when it resumes and its acceptance is measured no
  // more; at batch 1 on the CPU the margin stopped the self-distilled draft LM in every dip
  // of its acceptance, 0.84-0.96 of the best fixed budget against 0.99 with no margin). Where
  // drafting is at break-even (the bundled model on CPU from batch 16: a verified row costs what a
  // decoded token does, ~0.23 ms at batch 16) the optimum sits exactly on the margin, and the cost
  // model's error on drafted steps (measured 5-10% low there) turned those nodes into a 2-8% loss;
  // where drafting pays (small batches, GPUs) the nodes it removes added almost nothing. It scales
  // with the batch, from none at one decoding sequence to all of it at margin_full_batch: the
  // error it answers is the cost model's over a batch's many marginal nodes (batches 16-64),
  // while at batch 1 it stopped a paying draft LM in each dip of its acceptance (0.78-0.93 of
  // the best fixed budget with it, 0.90-0.99 without; n-gram the same either way) and at batch 4
  // the ninth session measured n-gram no worse without it.
  double node_margin = 0.1;
  // Whether a sequence that drafted at the last plan keeps its first nodes without the margin
  // (the hysteresis above).
  bool margin_hysteresis = true;
  // Decoding sequences from which node_margin applies in full (1: at every batch size).
  int32_t margin_full_batch = 16;
  // Whether a sequence that drafted at its last step is valued in its streak (AcceptanceModel:
  // its last draft kept whole, in part, or rejected), not at its average alone.
  bool acceptance_streaks = true;
  // A plan with every sequence at 0 and nothing explored is reused for up to this many plans in
  // all (see "Quiet plans" above); 1: every plan in full.
  int32_t quiet_replan_every = 16;
  // The step without drafts re-measured: a decode-only plan whose drafts are predicted to gain
  // less than this factor in tokens per second, while no recent step measured the shape the
  // step would have without them (StepCostModel::MeasuredRecently: every step drafted for ~23
  // steps), drafts nothing for two plans, at most once every kPlansPerRemeasure plans. Drafting
  // steps measure only drafted shapes, so the price of not drafting is then held from before
  // (or inferred from its neighbours) and drifts from the truth unseen; where the gain is small
  // that error decides. Served at 32 requests/s on the CPU (SpecFormer, ~2 decoding sequences),
  // drafted steps at batch 1 were planned against a no-draft step of 604 us where undrafted ones
  // measured 442 (794 vs 619 at batch 2): the drafts looked 27% ahead and ran 7% behind; at the
  // start of an in-process run at batch 1, 680 us against 470 (38% ahead, 5% behind). Two
  // plans, because the first step after a drafted one is slower (the drafter evicted the
  // target's weights from the caches) and is booked to drafting, not to the shape (Observe); the
  // second one measures it. Costs at most two plans' gain in 64 where drafts gain less than the
  // factor (at most 1% of throughput). Not higher: the two plans without drafts perturb a batch
  // that drafts well (bench-policy's "pays" at batch 64, predicted 1.53x: at 1.5 the
  // re-measures left 27 of its 64 sequences drafting 7 nodes and the rest none, 0.83x of the
  // throughput with them spread). A decode-only shape that no step ever measured
  // (StepCostModel::Visited) is measured so before its first drafts, whatever their predicted
  // gain: its price is then the first guess, a roofline scaled from the run's first step (a
  // prompt's prefill). At the start of a run at batch 1 on the CPU that guess put the step
  // without drafts at 0.81 ms where it took 0.44, and SpecFormer, which loses there, drafted for
  // ~300 steps: the drafted steps only measured drafted shapes (slowed by the drafter's evicting
  // the target's weights), which bound the undrafted one from above only. Measured by few steps
  // (StepCostModel::Visited(tokens, kSettledSteps) false), the price is measured again every
  // kPlansPerRemeasure plans while stale, whatever the gain: a run's first steps run on cold caches
  // (0.52-0.62 ms where later ones took 0.40), and that price, held, kept the drafts on for ~250
  // steps. <= 1: never.
  double remeasure_below_speedup = 1.25;
  uint64_t seed = 0x5eed;
  // Drafting epochs against no-draft epochs, measured end to end: drafting stops where it does
  // not beat not drafting (drafting_audit.h).
  DraftingAuditOptions audit;
};

// A running, decoding sequence that may draft this step.
struct BudgetCandidate {
  int64_t id = 0;
  std::string drafter;
  int32_t max_nodes = 0;          // the request's cap and the room left (0: cannot draft)
  int64_t context = 0;            // tokens in its cache
  int64_t unobserved_tokens = 0;  // its drafter must catch up on these before proposing
  int64_t tokens_left = -1;       // it may still generate this many (< 0: unknown)
};

// What the step holds before drafts: every decoding sequence's pending token, prompt chunks.
struct StepBase {
  int32_t decoding = 0;  // decoding sequences (each yields one token without drafts)
  StepShape shape;
  StepShape chunks;  // the part of `shape` that is prompt chunks
  // The most draft nodes the step may hold in all (negative: no bound): what the step's token
  // budget leaves after the decodes and the prompt chunks, so that drafts never displace a prompt
  // chunk (prefill progresses as without speculation) nor grow the step past its budget.
  int64_t max_nodes = -1;
};

struct BudgetDecision {
  std::vector<int32_t> budgets;  // per candidate, in order
  double predicted_seconds = 0;  // target + drafters + overhead, at these budgets
  double predicted_tokens = 0;   // expected tokens the step yields
  double no_draft_seconds = 0;   // the same step without drafts
  double no_draft_tokens = 0;    // what it yields (one token per decoding sequence)
  double explored_nodes = 0;     // nodes added by exploration (not by the optimum)
  // The reach a draft node needs to pay for its forward row (DraftRequest::min_reach): one more
  // row's predicted seconds times the step's predicted tokens per second (a node of reach p is
  // worth its row iff Y / S <= (Y + p) / (S + dS), i.e. p >= dS * Y / S). 0 when the models are
  // not ready or DraftBudgetOptions::prune_by_reach is off.
  double min_reach = 0;
  // Per candidate, the same price for a drafter that runs one forward per depth (the draft LM):
  // the expected reach its next depth must add, summed over the call's sequences, to be worth
  // running (DraftRequest::depth_reach). One more depth and one more node of the drafter's cost
  // fit, times the step's tokens per second. 0 when the models are not ready, the candidate does
  // not draft, or DraftBudgetOptions::prune_by_reach is off.
  std::vector<double> depth_reach;
  // Steps from this one on (it included) for which none of the candidates will be given a draft
  // budget: the rest of the drafting audit's no-draft epoch (DraftingAudit::UndraftedStepsAhead),
  // 0 otherwise. A promise the engine may rely on to skip keeping the drafters' hidden states
  // (StepPlan::DraftBudget::quiet_steps); breaking it costs draft quality, never correctness.
  int32_t quiet_steps = 0;
  // Tokens per second at the budgets over tokens per second without drafts (>= 1 unless the
  // models are not ready or exploration costs).
  double predicted_speedup() const;
};

// A measured step, for the models.
struct StepMeasurement {
  StepShape shape;
  double target_seconds = 0;  // the target forward + verification + KV commit
  double other_seconds = 0;   // the rest of the step's wall time (scheduling, transport, output)
  std::vector<DrafterCall> drafter_calls;
  struct Sequence {
    int64_t id = 0;
    std::string drafter;
    int32_t nodes = 0;  // tree nodes verified this step (0: no draft)
    int32_t depth = 0;
    int32_t accepted = 0;
    int32_t asked = 0;  // the budget the plan gave it (0: unknown, supply not observed)
  };
  std::vector<Sequence> sequences;
};

class DraftBudgetPolicy {
 public:
  // The most steps a catch-up is spread over (see the header's comment).
  static constexpr int64_t kCatchUpHorizon = 16;
  // The observed tokens a candidate's drafting is charged this step: the steady part in full,
  // the rest of its backlog spread over the steps it can still draft. The steady part is what a
  // drafting step of it observes: the tokens its previous step committed, `steady_tokens` (its
  // expected accepted tokens plus the target's), at most max_nodes + 1. Charged as max_nodes + 1
  // whatever its acceptance, a sequence resuming after a pause (or a new one) paid ~13 tokens
  // of catch-up more than it would observe per step, 0.18 ms on a 0.77 ms step at batch 1 on
  // the CPU: enough to keep a paying draft LM from resuming.
  static double CatchUpCharge(const BudgetCandidate& candidate, double steady_tokens);

  explicit DraftBudgetPolicy(DraftBudgetOptions options = {});
  // Movable, not copyable: the last plan's audit is held by address (a moved std::map keeps its
  // nodes; a copy would point into the original's).
  DraftBudgetPolicy(DraftBudgetPolicy&&) = default;
  DraftBudgetPolicy& operator=(DraftBudgetPolicy&&) = default;
  DraftBudgetPolicy(const DraftBudgetPolicy&) = delete;
  DraftBudgetPolicy& operator=(const DraftBudgetPolicy&) = delete;

  BudgetDecision Plan(const StepBase& base, const std::vector<BudgetCandidate>& candidates);
  void Observe(const StepMeasurement& step);
  // The gaps between streamed chunks that the latency bound reads (planned steps only).
  const StepGapTail& gap_tail() const { return gap_tail_; }
  // The request ended: drop its acceptance and exploration state.
  void Forget(int64_t id);
  // Spare compute: tokens the forward of `base` could add before its predicted time grows by
  // `tolerance` (e.g. 0.05 = 5%); 0 when the model is not ready.
  double SpareTokens(const StepShape& base, double tolerance = 0.05) const;

  StepCostModel& target_cost() { return target_cost_; }
  const StepCostModel& target_cost() const { return target_cost_; }
  // The target's predicted seconds for a step of `shape`, with prompt chunks or without (see
  // chunk_fit_); PredictRecent's knots with `recent`.
  double PredictTarget(const StepShape& shape, bool recent = false) const;
  const DrafterCostModel* drafter_cost(const std::string& drafter) const;
  const AcceptanceModel& acceptance() const { return acceptance_; }
  double other_seconds() const { return other_seconds_; }
  // What a step with `rows` draft rows takes beyond the step cost fit's prediction for its shape
  // and the mean overhead, its drafters' calls aside (at least 0; 0 without rows): see
  // drafted_. The fit of the last plan's drafters (or, before a plan, of the drafters of the last
  // drafted step measured).
  double DraftedStepExcess(double rows) const { return ExcessOf(excess_, rows); }
  // Seconds of every step measured so far.
  double measured_seconds() const { return measured_seconds_; }
  // Plans that reused a quiet plan (DraftBudgetOptions::quiet_replan_every).
  uint64_t quiet_plans() const { return quiet_plans_; }
  // The drafting audit of the batch last planned: one per set of drafters its candidates use
  // (see audits_); a default one before any plan.
  const DraftingAudit& audit() const { return current_ ? current_->audit : idle_audit_; }
  // Plans the audit kept without drafts (a no-draft epoch).
  uint64_t audited_plans() const { return audited_plans_; }

 private:
  // Each candidate's expected draft (tokens and rows) at every budget up to its max_nodes.
  std::vector<AcceptanceModel::Tables> ExpectedDrafts(
      const std::vector<BudgetCandidate>& candidates) const;
  // Seconds and expected tokens of the step at `budgets`; the forward's shape and its expected
  // draft rows in `shape` and `rows` when given.
  std::pair<double, double> Evaluate(const StepBase& base,
                                     const std::vector<BudgetCandidate>& candidates,
                                     const std::vector<AcceptanceModel::Tables>& expected,
                                     const std::vector<int32_t>& budgets,
                                     StepShape* shape_out = nullptr,
                                     double* rows_out = nullptr) const;
  // What the step's prompt chunks add to its predicted seconds: work the step does anyway, left
  // out of the decoding rate a draft node must beat (counting it would make any draft look cheap
  // next to a long chunk).
  double ChunkSeconds(const StepBase& base) const;
  // What a second of drafting work is worth in tokens in a step of `seconds` and `tokens`: the
  // rate a node must not lower (Allocate's: the step's tokens over its seconds without its prompt
  // chunks) raised by the margin. 0 when the models are not ready or prune_by_reach is off (no
  // prices).
  double TokensPerSecondPrice(const StepBase& base, double seconds, double tokens) const;
  // BudgetDecision::min_reach: one more row of a forward of `shape` and `rows` draft rows, priced.
  double MinReach(const StepShape& shape, double rows, double price) const;
  // BudgetDecision::depth_reach of `drafter`: one more depth and node of its cost fit, priced.
  double DepthReach(const std::string& drafter, double price) const;
  // The target's seconds for `shape` plus `rows` more (expected, so fractional) rows; with rows,
  // plus what drafted steps measured beyond that (DraftedStepExcess). With `knots` (the step cost
  // fit's KnotPart by token count from `knots_from` on, filled as needed; NaN = not yet), the
  // same value without recomputing a token count's knot part.
  double TargetSeconds(StepShape shape, double rows, std::vector<double>* knots = nullptr,
                       int64_t knots_from = 0) const;
  // In a step that also prefills, a draft row costs at least what a prompt row of the same forward
  // costs (that many rows are past any free verification): the step's seconds without drafts plus
  // that per row. The fit alone priced them at ~0 there (steps of 65-130 rows are mostly prompt
  // chunks, whose per-step cost and the knots above them it cannot tell apart), and the
  // prefill-step bound let 10-65 draft rows into steps it predicted 5% longer that ran 1-8 ms
  // longer (n-gram at 36 requests/s: p99 inter-token latency 10-15 ms against 7 without drafts).
  struct DraftRowFloor {
    double base_seconds = 0, row_seconds = 0;  // 0: no floor (a decode-only step)
    double Apply(double seconds, double rows) const {
      return rows > 0 ? std::max(seconds, base_seconds + rows * row_seconds) : seconds;
    }
  };
  DraftRowFloor RowFloor(const StepBase& base) const;
  // The step's predicted seconds with no drafts (Evaluate's with every budget 0).
  double NoDraftSeconds(const StepBase& base) const;
  // The margin a node must clear this step: DraftBudgetOptions::node_margin from
  // margin_full_batch decoding sequences on, less below, none with one.
  double Margin(const StepBase& base) const;
  // The most seconds a step may take with drafts (max_step_increase; infinity without a bound).
  double StepLimit(double no_draft_seconds) const;
  // The most seconds an exploring step may take: (1 + max_step_increase) times the streams' p99
  // gap once measured (or StepLimit, if longer); infinity without a bound on it.
  double ExplorationLimit(double no_draft_seconds) const;
  // Plan without recording the plan for gap_tail_.
  BudgetDecision PlanStep(const StepBase& base, const std::vector<BudgetCandidate>& candidates);
  StepGapTail gap_tail_;
  struct PlannedGap {
    bool planned = false;  // a plan preceded the step Observe reports next
    double predicted = 0, no_draft = 0;
    int32_t gaps = 0;  // its decoding sequences
    bool prompt_chunks = false;
  } planned_gap_;
  // Greedy marginal allocation of the step's nodes within `step_limit` seconds (see the header);
  // expected[i]: candidate i's expected tokens and rows at every budget.
  std::vector<int32_t> Allocate(const StepBase& base,
                                const std::vector<BudgetCandidate>& candidates,
                                const std::vector<AcceptanceModel::Tables>& expected,
                                double step_limit) const;
  // One greedy pass of Allocate. sunk[k]: drafter k's per-call seconds left out of the ratios
  // until its first sequence drafts (then counted in the step's seconds). amortized (when given):
  // per drafter, set when some sequence's first bundle would beat the decoding rate without its
  // drafter's per-call seconds.
  std::vector<int32_t> Greedy(const StepBase& base, const std::vector<BudgetCandidate>& candidates,
                              const std::vector<AcceptanceModel::Tables>& expected,
                              double step_limit, const DrafterIndex& drafters,
                              const std::vector<double>& sunk, std::vector<bool>* amortized) const;

  DraftBudgetOptions options_;
  StepCostModel target_cost_;
  // What prompt chunks add to a step: chunk_fit_'s per step and per kChunkRowUnit chunk rows
  // (both at least 0), fitted on what steps with chunks measured beyond target_cost_'s price
  // for their other rows (DecodePart). A step with chunks is priced as that sum once
  // kChunkFitSamples such steps were measured; before, by target_cost_ alone (rows are rows).
  // target_cost_ prices a chunk step by its rows with a constant for "holds a chunk", and a prompt
  // row costs far less than a decode or draft row (it needs no logits: the vocabulary
  // projection and sampling, most of a row's cost for a small model; served at 16 decoding
  // sequences on the CPU a 16-row decode step took 3.4 ms and the same step with a 64-row chunk
  // 7.6). The constant and the knots that only chunk steps reach (64-256 rows there) priced the
  // same steps two ways, and the split the data left free went wrong: the constant at -10 ms
  // (clamped to 0 when predicting) and those knots 2.5x too high, so that the prefill steps were
  // predicted at 13.5 ms where they took 7.9, and the prefill-step bound, 5% of that, let drafts
  // make them (the streams' p99 gap under load) 8% slower.
  ForgettingLeastSquares chunk_fit_;
  static constexpr double kChunkRowUnit = 64;
  static constexpr int64_t kChunkFitSamples = 4;
  // The part of `shape` target_cost_ prices in a step with prompt chunks: its other rows, and
  // their attention (the shape's less the chunks', or, where that is not known, less chunk^2 / 2).
  static StepShape DecodePart(const StepShape& shape);
  // chunk_fit_'s price for the chunks of `shape` (0 without chunks).
  double ChunkPart(const StepShape& shape) const;
  bool ChunkFitReady() const { return chunk_fit_.samples() >= kChunkFitSamples; }
  std::map<std::string, DrafterCostModel> drafter_cost_;
  AcceptanceModel acceptance_;
  double other_seconds_ = 0;
  bool other_seen_ = false;
  // drafted_: drafted steps' measured excess over the step cost fit's prediction for their shape
  // plus other_seconds_, fitted as a part per drafted step and a part per draft row (features 1 and
  // rows / kDraftRowUnit; prior 0) over recent drafted steps. The step cost fit prices a shape
  // whatever ran beside it, the overhead is averaged over every step, and a knot that only drafts
  // visit relaxes toward the fresh knot below it between visits; none of them sees what drafting
  // does to the step around it. Three processes on 2 cores, the draft LM at concurrency 4 (its
  // calls predicted within 10%): drafted steps ran 0.25 ms longer outside the target than the mean
  // overhead (the drafter service's threads share the cores with the transport), and steps of 24-32
  // rows took 2.4-2.8 ms in the target where the fit, its 16-64-token knots relaxed to the 4-token
  // decode's 0.7-1.1 ms, predicted ~1 ms; the plans drafted 20-28 nodes into them and the runs read
  // 0.90-0.93x of no speculation.
  // A drafter's call (and the verify forward's other kernels) evicted the target's weights from
  // the caches, and they come back over several steps, not one: at batch 1 on the CPU (the 6M
  // target's weights fill most of the last-level cache) the ten decode steps after a lone
  // SpecFormer draft took 196, 165, 111, 96, 69, 55, 54, 43, 36 and 22 us longer than the steady
  // 385 us, 2.2 steps' time in all, of which the policy charged the first. Charged to nothing, a
  // sequence that drafts now and then paid it unseen. So the undrafted steps at each position k
  // (up to kAftermathSteps) after a drafted one are measured: their time over the step cost fit's
  // prediction, averaged over windows (after_ratio), against the same ratio of undrafted steps
  // further from any draft (far_ratio_, so that a fit that is off prices nothing). A drafted
  // step's sample in its excess fit waits for its window and adds the estimated excess of the
  // undrafted steps that followed it (not of those a next drafted step absorbed: drafting every
  // step pays its own eviction in its own steps); an exploration's window is charged to the
  // share. On a GPU (nothing evicted) the ratios agree and nothing is charged.
  // One fit and one set of aftermath averages per set of drafters (the drafted step's, by name,
  // sorted, as the audits are keyed): a drafter whose calls evict more of the caches pays more
  // per drafted step, and a server that moves from one drafter to another must not price the
  // second with the first's (on the closed-loop batch-1 machine, after a drafter whose steps ran
  // 1.6x for 24 steps after each draft, one fit for all held 1.4 ms per drafted step for the
  // next, paying drafter, which then drafted at no speculation's rate: 1,431 tokens/s where a
  // fresh policy reached 1,569; with the fit per set but the aftermath shared, 1,425 vs 1,522).
  static constexpr int32_t kAftermathSteps = 16;
  struct DraftedSteps {
    ForgettingLeastSquares excess{{0.0, 0.0}, /*prior_weight=*/0.5, /*forgetting=*/0.95};
    std::array<double, kAftermathSteps> after_ratio{};
    std::array<int32_t, kAftermathSteps> after_samples{};
  };
  std::map<std::string, DraftedSteps> drafted_;
  const DraftedSteps* excess_ = nullptr;  // DraftedStepExcess's (see there)
  DraftedSteps* last_drafted_ = nullptr;  // the last drafted step's drafters'
  // The drafted steps' state of drafter set `key`, made on first use.
  DraftedSteps& DraftedOf(const std::string& key);
  static double ExcessOf(const DraftedSteps* set, double rows);
  // The drafters of a measured step (its calls' and drafted sequences'), as a key.
  const std::string& StepDrafters(const StepMeasurement& step);
  static constexpr double kAftermathRatioCap = 3;  // a step's ratio counts as at most this
  static constexpr double kAftermathRate = 0.05;   // the positions' averages (~20 windows)
  static constexpr double kFarRate = 0.01;
  double far_ratio_ = 1.0;  // the fit's own prediction until steps far from drafts are seen
  int64_t far_samples_ = 0;
  int32_t since_drafted_ = kAftermathSteps;  // undrafted steps since the last drafted one
  bool exploration_window_ = false;          // the last drafted step explored
  struct PendingSample {
    bool waiting = false;
    DraftedSteps* set = nullptr;  // the drafted step's drafters'
    double rows = 0;              // the drafted step's draft rows / kDraftRowUnit
    double excess = 0;            // its own measured excess
    double aftermath = 0;         // its window's so far
  } pending_sample_;
  // The estimated excess of an undrafted step k positions after a drafted one (0: the next),
  // priced `predicted` without it (0 before any window reached k).
  double AftermathSeconds(int32_t k, double predicted) const;
  // Ends the drafted step's window: its sample, if any, is learned.
  void CloseAftermath();
  static constexpr double kDraftRowUnit = 16;
  bool after_catch_up_ = false;  // the last observed step had a drafter's catch-up
  std::unordered_map<int64_t, int32_t> idle_plans_;  // plans in a row at budget 0
  std::unordered_map<int64_t, int32_t> trial_left_;  // plans left in a sequence's trial
  std::unordered_set<int64_t> drafted_last_plan_;    // sequences whose last plan drafted
  // Per drafter: its sequences' probes wait probe_after x this many plans.
  std::map<std::string, int32_t> probe_backoff_;
  // The last full plan, while later plans may reuse it: every candidate at 0, nothing explored.
  struct QuietPlan {
    std::vector<std::pair<int64_t, std::string>> candidates;  // id and drafter, in order
    std::vector<std::string> drafters;  // the planned batch's drafters, each once
    int32_t decoding = 0;
    int32_t reusable = 0;  // plans that may still reuse it
    int32_t reused = 0;    // plans that did (their idle counts and relaxation not applied yet)
    // Reuses left before a probe or the extra node comes due; past them only while
    // ExplorationShareUsedUp().
    int32_t due_in = 0;
    bool planned = false;  // `candidates` is the batch `decision` was planned for
    // >= 0: the predicted extra seconds of an exploration that was due but did not fit the
    // share; reused only while it still does not.
    double waiting_extra = -1;
    BudgetDecision decision;
  };
  // The plans a sequence of `drafter` waits at 0 nodes before its probe (probe_after x backoff).
  int32_t ProbeWait(const std::string& drafter) const;
  // A waiting exploration's cost is re-planned in full once the share holds this much of it.
  static constexpr double kWaitingExtraShare = 0.9;
  // A sequence id the acceptance model holds nothing for: it reads its drafter's average.
  static constexpr int64_t kDrafterAverage = std::numeric_limits<int64_t>::min();
  // Steps the step cost fit must have observed before a quiet plan is reused.
  static constexpr int64_t kQuietAfterSteps = 64;
  // Whether this plan reuses quiet_ (and counts it), with its decision for `candidates` (every
  // budget 0); false ends the quiet stretch.
  bool ReuseQuietPlan(const StepBase& base, const std::vector<BudgetCandidate>& candidates,
                      BudgetDecision* decision);
  // Every one of n sequences at 0, the step predicted to take `seconds` for one token per
  // decoding sequence (no row price).
  static BudgetDecision Undrafted(size_t n, double seconds, int32_t decoding);
  // Every one of n sequences at 0, with the step's own predictions (Evaluate's with no drafts).
  BudgetDecision ZeroDecision(const StepBase& base, size_t n) const;
  // Whether a decode-only plan drafting `budgets` re-measures the step without drafts instead
  // (DraftBudgetOptions::remeasure_below_speedup).
  bool RemeasuresTheStepWithoutDrafts(const StepBase& base,
                                      const std::vector<BudgetCandidate>& candidates,
                                      const std::vector<AcceptanceModel::Tables>& expected,
                                      const BudgetDecision& decision) const;
  // The plan of a step whose token budget has no room for drafts (base.max_nodes == 0).
  BudgetDecision PlanWithoutRoom(const StepBase& base,
                                 const std::vector<BudgetCandidate>& candidates);
  // Whether exploration_share has no room left for any exploration (what comes due waits).
  bool ExplorationShareUsedUp() const;
  // Plans that may go by before a probe of `candidates` or the extra node comes due (<= 0: the
  // next one).
  int64_t PlansBeforeExploration(const std::vector<BudgetCandidate>& candidates) const;
  // Applies what the reusing plans left pending to quiet_.candidates (reused back to 0).
  void CreditQuietPlans();
  // Applies what the reusing plans left pending and forgets quiet_.
  void EndQuietPlans();
  // After a full plan: makes it reusable if it was quiet.
  void KeepIfQuiet(const StepBase& base, const std::vector<BudgetCandidate>& candidates,
                   const BudgetDecision& decision, double waiting_extra);
  QuietPlan quiet_;
  uint64_t quiet_plans_ = 0;
  // The drafting audit (drafting_audit.h): it counts steps once the step cost fit has seen
  // kAuditAfterSteps (its yardstick is the fit's prices, frozen per pair of epochs). One audit
  // per set of drafters a batch's candidates use (their names, sorted, joined by commas): what
  // one drafter's epochs measured says nothing of another's, and a server whose requests move
  // from one drafter to another would otherwise start each under the last one's verdict. A
  // batch mixing drafters has its own.
  static constexpr int64_t kAuditAfterSteps = 64;
  struct Audit {
    explicit Audit(const DraftingAuditOptions& options) : audit(options) {}
    DraftingAudit audit;
    StepCostModel::Prices prices;
    uint64_t prices_pair = std::numeric_limits<uint64_t>::max();  // ended_pairs() at the copy
  };
  std::map<std::string, Audit> audits_;
  Audit* current_ = nullptr;  // the last plan's (std::map nodes stay put)
  DraftingAudit idle_audit_;  // what audit() reads before any plan
  std::string audit_key_;     // scratch for the key, kept to reuse its allocation
  // The audit of `candidates`' drafters (those that may draft; the last plan's when none may;
  // null with the audit off), and points excess_ at their drafted-step excess fit.
  Audit* AuditOf(const std::vector<BudgetCandidate>& candidates);
  // Sorts and joins `names` (each once) into audit_key_.
  const std::string& SetKey(std::vector<const std::string*>& names);
  struct AuditedStep {
    bool planned = false;    // a plan preceded the step that Observe reports next
    bool countable = false;  // decode-only, and some sequence could draft
    int32_t decoding = 0;
    StepShape shape;  // the step without drafts
    Audit* audit = nullptr;
  } audited_step_;
  uint64_t audited_plans_ = 0;
  // A plan in the audit's no-draft epoch: every sequence at 0, nothing explored, the policy's own
  // state as after a plan that drafted nothing (its quiet plan ended), and its predictions from
  // the step cost fit's recent prices.
  BudgetDecision PlanWithoutDrafting(const StepBase& base,
                                     const std::vector<BudgetCandidate>& candidates);
  // Feeds the step Observe measured to the audit its plan used.
  void AuditStep(const StepMeasurement& step, double wall);
  uint64_t plans_ = 0;
  // Re-measuring the step without drafts (DraftBudgetOptions::remeasure_below_speedup): whether
  // the next plan is its second, and the plan it last started at.
  static constexpr uint64_t kPlansPerRemeasure = 64;
  // How much a decode-only shape must have been measured (StepCostModel::Visited: 3 steps of a
  // knot's own size, 6 between two knots) before a re-measure waits for the drafts' predicted
  // gain to fall below remeasure_below_speedup; before, it comes every kPlansPerRemeasure plans
  // while the shape is stale, whatever the gain.
  static constexpr double kSettledSteps = 6;
  bool remeasure_second_plan_ = false;
  uint64_t remeasured_at_plan_ = 0;
  uint64_t rng_;
  double measured_seconds_ = 0;  // every measured step's seconds so far
  double explored_seconds_ = 0;  // of which exploration's (at least as predicted)
  struct PendingExploration {
    double optimum_seconds = 0;  // the plan's predicted seconds without its exploration
    double charged_seconds = 0;  // what exploration was charged when planned
  } pending_exploration_;
};

}  // namespace specula
