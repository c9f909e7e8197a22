#include "tools/cli/spec_flags.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/model/cpu_runtime.h"

namespace specula::cli {

StatusOr<SpecEngineOptions> SpecFlags::EngineOptions(int64_t max_batch_size) const {
  if (max_step_tokens < 1) {
    return InvalidArgumentError(
        StrCat("--max-step-tokens must be at least 1, got ", max_step_tokens));
  }
  if (drafter_context < 0 || drafter_context == 1) {
    return InvalidArgumentError(
        StrCat("--drafter-context must be 0 (all) or at least 2, got ", drafter_context));
  }
  auto placement = ParseVerifyPlacement(verify_placement);
  if (!placement.ok()) return placement.status().WithContext("--verify-placement");
  return SpecEngineOptions{.max_batch_size = static_cast<int32_t>(max_batch_size),
                           .max_step_tokens = max_step_tokens,
                           .drafter_context = drafter_context,
                           .verify_placement = *placement};
}

void SpecFlags::Register(FlagSet& flags, bool many_drafters) {
  flags.AddInt(
      "max-step-tokens", &max_step_tokens,
      "tokens per target forward: running sequences' tokens and drafts first, then "
      "prompts are prefilled in chunks with the rest (a long prompt never stalls decodes)");
  flags.AddInt("drafter-context", &drafter_context,
               "specformer, beagle, parallelspec: the most recent tokens a drafter catches up on; "
               "a sequence that went longer without drafting (or a longer prompt) restarts its "
               "drafter from that many recent tokens, so a probe or a resumed draft costs at most "
               "that many rows (0 = all: a long-idle sequence is detached instead)");
  flags.AddString("drafter", &drafter,
                  many_drafters ? "comma-separated drafters to compare with no speculation: " +
                                      drafters->Describe()
                                : "none, " + drafters->Describe());
  drafters->RegisterFlags(flags);
  if (!many_drafters) {
    flags.AddInt("draft-len", &draft_len, "draft tokens per step (--draft-budget fixed)");
    flags.AddString("draft-budget", &draft_budget,
                    "fixed: --draft-len nodes every step | adaptive: each step's nodes chosen "
                    "from measured step costs and acceptance, up to --draft-cap");
  }
  flags.AddInt("draft-cap", &draft_cap, "adaptive: most draft nodes per step for one request");
  flags.AddDouble("max-draft-slowdown", &max_draft_slowdown,
                  "adaptive: drafts may make the p99 gap between streamed chunks at most this "
                  "fraction longer than without them: a step may grow by this fraction of itself "
                  "or of the measured p99 gap, less the steps' own p99.9 jitter (negative = no "
                  "bound, tokens per second alone decide)");
  flags.AddDouble("max-prefill-step-slowdown", &max_prefill_step_slowdown,
                  "adaptive: a step that also prefills prompt chunks (the longest gap in the "
                  "other streams: p99 inter-token latency under load) may be made at most this "
                  "fraction slower by drafts, or as slow as its decodes alone with their drafts "
                  "(negative = no bound)");
  flags.AddBool("prune-drafts", &prune_drafts,
                "adaptive: drafters that estimate how likely each node is to be accepted (ngram "
                "by its match length, draft-model by its probability) leave out the nodes not "
                "worth verifying, and draft-model the depths not worth drafting, at the step's "
                "measured costs (--prune-drafts=false: every node within the budget)");
  flags.AddDouble("draft-margin", &draft_margin,
                  "adaptive: a draft node is added only if its expected tokens per second beat "
                  "decoding without it by this fraction (a margin for the cost and acceptance "
                  "models' error where drafting is at break-even; in full from 16 decoding "
                  "sequences, scaled down below, none with one; 0 = any gain, at least 0)");
  flags.AddBool("draft-audit", &draft_audit,
                "adaptive: alternate drafting with short no-draft checks (and, where drafting "
                "loses, no-draft stretches with short drafting trials), compare their measured "
                "tokens per second, and draft only while drafting wins "
                "(common/spec/drafting_audit.h; false: the policy's predictions alone decide)");
  flags.AddString("cost-profile", &cost_profile,
                  "adaptive: warm-start the step cost model from `specula bench-forward --json`");
  flags.AddString("step-trace", &step_trace,
                  "adaptive: write one JSON line per engine step to this file: the draft budget's "
                  "plan (its predicted seconds and tokens, with and without drafts) next to what "
                  "the step measured (common/spec/step_trace.h); empty = none");
  flags.AddString("verify", &verify,
                  "greedy | sample (lossless; default by --temperature) | specdec | typical "
                  "(both LOSSY)");
  flags.AddString("verify-placement", &verify_placement,
                  "where lossless verification runs: auto (on the logits tensor on an "
                  "accelerator, on the host for CPU logits) | host | tensors");
  flags.AddDouble("beta", &beta, "specdec: accept drafts within the target's top-beta");
  flags.AddDouble("tau", &tau, "specdec: largest log-probability gap to the top-1");
  flags.AddDouble("typical-epsilon", &typical_epsilon, "typical: probability threshold");
  flags.AddDouble("typical-delta", &typical_delta, "typical: entropy-scaled threshold");
}

StatusOr<std::vector<std::string>> SpecFlags::DrafterNames() const {
  std::vector<std::string> names;
  std::stringstream in(drafter);
  std::string name;
  while (std::getline(in, name, ',')) {
    if (name.empty()) continue;
    if (name != "none" && !drafters->Find(name)) {
      return InvalidArgumentError(
          StrCat("--drafter: unknown drafter '", name, "' (none, ", drafters->Describe(), ")"));
    }
    names.push_back(name);
  }
  if (names.empty()) names.push_back("none");
  return names;
}

StatusOr<std::vector<std::unique_ptr<Drafter>>> SpecFlags::LoadDrafters(
    const ModelConfig& target, const ModelFlags& model, const ModelRunner* target_runner) const {
  ASSIGN_OR_RETURN(std::vector<std::string> names, DrafterNames());
  const ModelRunnerOptions options{
      .device = model.device,
      .dtype = model.dtype,
      .kv = {.block_size = model.kv_block_size, .memory_mb = model.kv_memory_mb},
      .packed_weights = model.cpu_packed_weights};
  if (!target_runner) {  // the drafter role: nothing set the process up for serving yet
    SetThreads(model.threads);
    ConfigureAllocatorForServing();
  }
  // In the drafter role the target is loaded (once) only if a drafter shares its weights.
  std::unique_ptr<DrafterLoadContext> context =
      target_runner ? std::make_unique<DrafterLoadContext>(*target_runner, options)
                    : std::make_unique<DrafterLoadContext>(target, model.model, options);
  std::vector<std::unique_ptr<Drafter>> loaded;
  for (const std::string& name : names) {
    if (name == "none") continue;
    ASSIGN_OR_RETURN(std::unique_ptr<Drafter> drafter, drafters->Load(name, *context));
    loaded.push_back(std::move(drafter));
  }
  return loaded;
}

Status SpecFlags::AddDrafters(SpecEngine& engine, const ModelFlags& model) const {
  ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Drafter>> drafters,
                   LoadDrafters(engine.target().config(), model, &engine.target()));
  for (auto& d : drafters) RETURN_IF_ERROR(engine.AddDrafter(std::move(d)));
  return OkStatus();
}

StatusOr<SpeculationSettings> SpecFlags::Settings(const std::string& name, int64_t len,
                                                  double temperature) const {
  if (len < 0 || len > kMaxDraftTokens) {
    return InvalidArgumentError(
        StrCat("--draft-len must be in [0, ", kMaxDraftTokens, "], got ", len));
  }
  SpeculationSettings s;
  s.drafter = name;
  s.max_draft_tokens = static_cast<int32_t>(len);
  if (!verify.empty()) {
    auto mode = ParseVerifyMode(verify);
    if (!mode.ok()) return mode.status().WithContext("--verify");
    s.verify.mode = *mode;
    if (verify == "greedy" && temperature > 0) {
      return InvalidArgumentError("--verify greedy needs --temperature 0 (use --verify sample)");
    }
  }
  s.verify.specdec_beta = static_cast<int32_t>(beta);
  s.verify.specdec_tau = static_cast<float>(tau);
  s.verify.typical_epsilon = static_cast<float>(typical_epsilon);
  s.verify.typical_delta = static_cast<float>(typical_delta);
  RETURN_IF_ERROR(s.verify.Validate());
  return s;
}

StatusOr<DraftBudgetOptions> SpecFlags::BudgetOptions() const {
  if (!std::isfinite(max_draft_slowdown)) {
    return InvalidArgumentError(
        StrCat("--max-draft-slowdown must be a finite number, got ", max_draft_slowdown));
  }
  if (!std::isfinite(max_prefill_step_slowdown)) {
    return InvalidArgumentError(StrCat("--max-prefill-step-slowdown must be a finite number, got ",
                                       max_prefill_step_slowdown));
  }
  if (!(draft_margin >= 0) || !std::isfinite(draft_margin)) {
    return InvalidArgumentError(
        StrCat("--draft-margin must be a finite number >= 0, got ", draft_margin));
  }
  DraftBudgetOptions options{.max_step_increase = max_draft_slowdown,
                             .max_prefill_step_increase = max_prefill_step_slowdown,
                             .prune_by_reach = prune_drafts,
                             .node_margin = draft_margin};
  options.audit.enabled = draft_audit;
  return options;
}

StatusOr<std::unique_ptr<BudgetPlanner>> SpecFlags::MakePlanner(int64_t max_step_tokens,
                                                                bool audited) const {
  if (draft_cap < 1 || draft_cap > kMaxDraftTokens) {
    return InvalidArgumentError(
        StrCat("--draft-cap must be in [1, ", kMaxDraftTokens, "], got ", draft_cap));
  }
  ASSIGN_OR_RETURN(DraftBudgetOptions options, BudgetOptions());
  options.audit.enabled = options.audit.enabled && audited;
  auto planner = std::make_unique<BudgetPlanner>(options, max_step_tokens);
  if (!cost_profile.empty()) {
    ASSIGN_OR_RETURN(auto points, LoadCostProfile(cost_profile));
    planner->policy().target_cost().WarmStart(points);
  }
  return planner;
}

StatusOr<std::unique_ptr<StepTrace>> SpecFlags::OpenStepTrace(bool adaptive,
                                                              const char* needs) const {
  if (step_trace.empty()) return std::unique_ptr<StepTrace>();
  if (!adaptive) {
    return InvalidArgumentError(
        StrCat("--step-trace traces the adaptive draft budget's plans: it needs ", needs));
  }
  return StepTrace::Open(step_trace);
}

StatusOr<std::vector<std::pair<StepShape, double>>> LoadCostProfile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFoundError(StrCat("--cost-profile: cannot open ", path));
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("results") || !j["results"].is_array()) {
    return InvalidArgumentError(
        StrCat("--cost-profile: ", path, " is not a `specula bench-forward --json` report"));
  }
  std::vector<std::pair<StepShape, double>> points;
  for (const auto& row : j["results"]) {
    if (!row.is_object() || !row.contains("tokens") || !row.contains("median_ms") ||
        !row.contains("context") || !row.contains("tokens_per_seq") || !row["tokens"].is_number() ||
        !row["median_ms"].is_number() || !row["context"].is_number() ||
        !row["tokens_per_seq"].is_number()) {
      return InvalidArgumentError(StrCat("--cost-profile: ", path,
                                         ": every result needs tokens, tokens_per_seq, context "
                                         "and median_ms"));
    }
    const double tokens = row["tokens"].get<double>();
    const double per_seq = row["tokens_per_seq"].get<double>();
    const double context = row["context"].get<double>();
    StepShape shape{.tokens = static_cast<int64_t>(tokens),
                    .attention = tokens * (context + per_seq)};
    points.push_back({shape, row["median_ms"].get<double>() / 1000.0});
  }
  if (points.empty()) return InvalidArgumentError(StrCat("--cost-profile: ", path, " is empty"));
  return points;
}

}  // namespace specula::cli
