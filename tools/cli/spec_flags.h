// Flags shared by the commands that decode speculatively (generate, bench): which drafters to
// load, the draft budget and the verification rule, and the code that turns them into a SpecEngine.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/drafters/drafter_registry.h"
#include "common/spec/budget_planner.h"
#include "common/spec/spec_engine.h"
#include "common/util/flags.h"
#include "tools/cli/model_flags.h"

namespace specula::cli {

// Most draft nodes per step an adaptive budget gives one request, unless the request sets its own.
inline constexpr int64_t kDefaultDraftCap = 16;
// --max-draft-slowdown: `bench` and `generate` have no latency bound unless asked for (their
// output is not streamed to a client waiting on each chunk: tokens per second decide).
inline constexpr double kDefaultMaxDraftSlowdown = -1;
// `serve` keeps what drafting adds to the streams' p99 inter-token gap within 5%: never worse than
// no speculation in tokens/s, TPOT or p99 ITL, at the price of drafts that would add tokens per
// second only by lengthening the gaps (batch 1 on a CPU, where a verified token costs 5-20% of a
// step; docs/BENCHMARKS.md, fortieth session). -1 for tokens per second alone.
inline constexpr double kServeMaxDraftSlowdown = 0.05;
// --max-prefill-step-slowdown: steps that prefill prompt chunks (the p99 inter-token gaps under
// load) are not made longer by drafts beyond this (DraftBudgetOptions::max_prefill_step_increase).
inline constexpr double kDefaultMaxPrefillStepSlowdown =
    DraftBudgetOptions{}.max_prefill_step_increase;

struct SpecFlags {
  std::string drafter = "none";  // generate: one name; bench: a comma-separated list
  // Every drafter kind and its own flags (--beagle-model, --ngram-max, ...): tools list none.
  std::shared_ptr<DrafterRegistry> drafters =
      std::make_shared<DrafterRegistry>(BuiltinDrafterRegistry());
  int64_t draft_len = 4;  // draft tokens per step (tree nodes)
  std::string verify;     // greedy | sample | specdec | typical ("" = by temperature)
  std::string verify_placement = "auto";  // auto | host | tensors (SpecEngineOptions)
  double beta = 3;
  double tau = 1.0;
  double typical_epsilon = 0.09;
  double typical_delta = 0.3;
  int64_t max_step_tokens = kDefaultMaxStepTokens;  // tokens per target forward (chunked prefill)
  // SpecEngineOptions::drafter_context (0 = all).
  int64_t drafter_context = kDefaultDrafterContext;
  std::string draft_budget = "fixed";    // generate: fixed (--draft-len) | adaptive
  int64_t draft_cap = kDefaultDraftCap;  // adaptive: most nodes a step gives one request
  std::string cost_profile;              // adaptive: `bench-forward --json` curve (warm start)
  // adaptive: the latency bound (DraftBudgetOptions::max_step_increase; < 0 = none).
  double max_draft_slowdown = kDefaultMaxDraftSlowdown;
  // adaptive: the prefill-step bound (DraftBudgetOptions::max_prefill_step_increase; < 0 = none).
  double max_prefill_step_slowdown = kDefaultMaxPrefillStepSlowdown;
  // adaptive: DraftBudgetOptions::prune_by_reach.
  bool prune_drafts = DraftBudgetOptions{}.prune_by_reach;
  // adaptive: DraftBudgetOptions::node_margin.
  double draft_margin = DraftBudgetOptions{}.node_margin;
  // adaptive: DraftBudgetOptions::audit.enabled (the drafting audit).
  bool draft_audit = DraftBudgetOptions{}.audit.enabled;
  std::string step_trace;  // adaptive: the per-step trace's path (StepTrace); "" = none

  void Register(FlagSet& flags, bool many_drafters);
  // The drafter names in --drafter, each "none" or one of the registry's (INVALID_ARGUMENT
  // listing them otherwise).
  StatusOr<std::vector<std::string>> DrafterNames() const;
  // Loads every drafter named in --drafter for a target of config `target` (the draft LM with
  // `model`'s device, dtype and KV settings). SpecFormer, Beagle and ParallelSpec share
  // `target_runner`'s weights; without one (the drafter role) the target in `model` is loaded
  // once for them.
  StatusOr<std::vector<std::unique_ptr<Drafter>>> LoadDrafters(
      const ModelConfig& target, const ModelFlags& model,
      const ModelRunner* target_runner = nullptr) const;
  // The engine's options: --max-step-tokens (INVALID_ARGUMENT below 1), --verify-placement and
  // `max_batch_size`.
  StatusOr<SpecEngineOptions> EngineOptions(int64_t max_batch_size) const;
  // LoadDrafters for the engine's target, added to `engine`.
  Status AddDrafters(SpecEngine& engine, const ModelFlags& model) const;
  // The per-request settings for one drafter and draft length; INVALID_ARGUMENT for a --verify
  // that contradicts the temperature (greedy verification of a sampled request).
  StatusOr<SpeculationSettings> Settings(const std::string& drafter, int64_t draft_len,
                                         double temperature) const;
  // The adaptive policy's driver, warm-started from --cost-profile when given; INVALID_ARGUMENT
  // for a --draft-cap outside [1, kMaxDraftTokens] or an unreadable profile.
  // audited: false turns the drafting audit off whatever --draft-audit says (bench's
  // adaptive-unaudited).
  StatusOr<std::unique_ptr<BudgetPlanner>> MakePlanner(int64_t max_step_tokens,
                                                       bool audited = true) const;
  // The --step-trace file (null without the flag); INVALID_ARGUMENT naming `needs` when no
  // adaptive budget runs (`adaptive` false) or the file cannot be created.
  StatusOr<std::unique_ptr<StepTrace>> OpenStepTrace(bool adaptive, const char* needs) const;
  // The adaptive budget's options from these flags (INVALID_ARGUMENT naming a bad one).
  StatusOr<DraftBudgetOptions> BudgetOptions() const;
};

// The step cost curve `specula bench-forward --json` wrote: (shape, seconds) per measured row.
StatusOr<std::vector<std::pair<StepShape, double>>> LoadCostProfile(const std::string& path);

}  // namespace specula::cli
