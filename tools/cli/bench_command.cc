// specula bench: speculative decoding against no speculation, in the same process on the same
// prompts, interleaved: for every batch size and repeat, each setting (none and every drafter x
// draft length, in an order rotated between repeats) generates max_new_tokens for the same
// prompts, checked against one untimed run without speculation: at least
// --min-requests requests per run, in waves of batch-size concurrent ones (so batch 1 is measured
// over many prompts, not one). With --interleave-requests N the settings take turns every N
// requests within each repeat instead of every run, so that a drift of the machine's speed (on a
// shared VM, 10-20% between seconds-long runs) falls on every setting of a repeat alike. Prints a
// table and writes every run to JSON.
//
// Whenever a LOSSY rule runs (--verify specdec/typical, --specdec-grid) the table adds what it cost
// in quality, against the lossless outputs of that untimed run: the share of requests
// identical to them, the mean position of the first divergence (over the diverging requests),
// token-level corpus BLEU-4, and the target's mean log-probability per generated token (the
// baseline's own is printed on its row for reference).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "common/spec/output_agreement.h"
#include "common/spec/spec_engine.h"
#include "common/tokenizer/tokenizer.h"
#include "tools/cli/bench_prompts.h"
#include "tools/cli/commands.h"
#include "tools/cli/model_flags.h"
#include "tools/cli/op_counter.h"
#include "tools/cli/spec_flags.h"
#include "tools/cli/target_log_probs.h"

namespace specula::cli {
namespace {

constexpr char kCommand[] = "bench";

struct BenchFlags {
  ModelFlags model;
  SpecFlags spec;
  std::string prompts;  // JSONL; empty = held-out sources
  std::string prompt_dir = kHeldOutPromptDir;
  int64_t num_prompts = 64;
  int64_t prompt_tokens = 128;
  std::vector<int64_t> batch_sizes = {1, 4, 16, 64};
  std::string draft_lens = "2,4,6,8,adaptive";
  std::string specdec_grid;  // "beta:tau,...": every drafter setting once per point (LOSSY)
  int64_t max_new_tokens = 128;
  int64_t repeats = 3;
  int64_t min_requests = 16;
  int64_t interleave_requests = 0;  // 0: each setting's run whole, in turn
  double temperature = 0;
  int64_t seed = 1;
  std::string json;
  bool count_ops = false;
  bool baseline_again = false;  // a second no-speculation setting: the run's own noise
};

// A --draft-lens entry: a fixed budget, or the policy with or without its drafting audit.
struct DraftLen {
  int64_t k = 0;  // adaptive: the cap
  bool adaptive = false;
  bool audited = true;  // adaptive: the drafting audit on (drafting_audit.h)
};

struct Setting {
  std::string drafter;    // "none" = the baseline
  int64_t draft_len = 0;  // adaptive: the cap
  bool adaptive = false;
  bool audited = true;
  // --specdec-grid: this setting's (beta, tau); otherwise --verify decides.
  std::optional<std::pair<int32_t, float>> specdec;
  bool again = false;  // --baseline-again: the baseline's second setting
  // As --draft-lens names it (and the JSON's draft_budget).
  const char* budget() const {
    return !adaptive ? "fixed" : audited ? "adaptive" : "adaptive-unaudited";
  }
  std::string label() const {
    if (drafter == "none") return again ? "none again" : "none";
    std::string label =
        !adaptive ? StrCat(drafter, " k=", draft_len) : StrCat(drafter, " ", budget());
    if (specdec) label += StrCat(" b", specdec->first, "t", specdec->second);
    return label;
  }
};

// --specdec-grid: "beta:tau" pairs (beta an integer >= 1, tau a finite number >= 0).
StatusOr<std::vector<std::pair<int32_t, float>>> ParseSpecDecGrid(const std::string& text) {
  std::vector<std::pair<int32_t, float>> grid;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    const size_t colon = item.find(':');
    char* end_beta = nullptr;
    char* end_tau = nullptr;
    const long long beta =
        colon == std::string::npos ? 0 : std::strtoll(item.c_str(), &end_beta, 10);
    const double tau =
        colon == std::string::npos ? -1 : std::strtod(item.c_str() + colon + 1, &end_tau);
    if (colon == std::string::npos || end_beta != item.c_str() + colon || *end_tau != '\0' ||
        beta < 1 || beta > 1000000 || !(tau >= 0) || !std::isfinite(tau)) {
      return InvalidArgumentError(
          StrCat("--specdec-grid: '", item,
                 "' is not beta:tau (beta an integer >= 1, tau a finite number >= 0)"));
    }
    grid.push_back({static_cast<int32_t>(beta), static_cast<float>(tau)});
  }
  return grid;
}

// The quality a lossy setting kept, per repeat (see the header comment).
struct Quality {
  OutputAgreement agreement;
  LogProbSum log_probs;
};

// --draft-lens: positive integers (fixed budgets), "adaptive" (the policy, capped at
// --draft-cap) and "adaptive-unaudited" (the policy without its drafting audit).
StatusOr<std::vector<DraftLen>> ParseDraftLens(const std::string& text, int64_t cap) {
  std::vector<DraftLen> lens;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    if (item == "adaptive" || item == "adaptive-unaudited") {
      lens.push_back({.k = cap, .adaptive = true, .audited = item == "adaptive"});
      continue;
    }
    char* end = nullptr;
    const long long k = std::strtoll(item.c_str(), &end, 10);
    if (*end != '\0' || k < 1 || k > kMaxDraftTokens) {
      return InvalidArgumentError(StrCat("--draft-lens: '", item,
                                         "' is neither adaptive, adaptive-unaudited nor an "
                                         "integer in [1, ",
                                         kMaxDraftTokens, "]"));
    }
    lens.push_back({.k = k});
  }
  if (lens.empty()) return InvalidArgumentError("--draft-lens is empty");
  return lens;
}

struct RunResult {
  double seconds = 0;
  int64_t tokens = 0;
  double draft_seconds = 0;
  double verify_seconds = 0;
  double forward_seconds = 0;  // the target forwards alone (part of verify_seconds)
  int64_t steps = 0;           // verification steps, summed over requests
  int64_t draft_steps = 0;
  int64_t draft_tokens = 0;
  int64_t draft_depth = 0;
  int64_t accepted_tokens = 0;
  int64_t mismatches = 0;  // requests whose output differs from the baseline's
  // Drafter failures (a step without speculation, or a sequence detached from its drafter): the
  // output stays lossless, so only these say that a drafter's numbers are not its own.
  int64_t draft_errors = 0;
  std::string first_draft_error;
  int64_t peak_drafter_state_bytes = 0;
  int64_t engine_steps = 0;  // target forwards (each serves the whole batch)
  int64_t budget_nodes = 0;  // adaptive: nodes the policy gave, over sequence-steps
  int64_t budgeted_sequence_steps = 0;
  int64_t audited_plans = 0;  // adaptive: plans the drafting audit kept without drafts
  int64_t ops = 0;            // --count-ops: LibTorch ops dispatched on the engine's thread
  std::map<std::string, int64_t> ops_by_name;
  std::optional<Quality> quality;  // lossy settings (and the baseline, for its log-probability)
  double tokens_per_s() const { return seconds > 0 ? tokens / seconds : 0; }
  // Tokens per verification step (accepted drafts + the target's own token).
  double a() const { return steps ? double(accepted_tokens + steps) / steps : 0; }
  // Draft tokens per drafting step.
  double k() const { return draft_steps ? double(draft_tokens) / draft_steps : 0; }
  // Draft positions per drafting step (the tree's depth; a chain's length).
  double l_d() const { return draft_steps ? double(draft_depth) / draft_steps : 0; }
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double Min(const std::vector<double>& v) {
  return v.empty() ? 0 : *std::min_element(v.begin(), v.end());
}

// Runs requests [begin, end) in consecutive waves of `batch_size` concurrent requests, adding to
// `r` and appending to `outputs` (request i's output at index i when they start together:
// `baseline` is indexed by request).
Status RunWaves(SpecEngine& engine, const std::vector<SpecRequest>& requests, size_t begin,
                size_t end, size_t batch_size, const std::vector<std::vector<int32_t>>* baseline,
                std::vector<std::vector<int32_t>>* outputs, BudgetPlanner* planner, bool count_ops,
                RunResult& r) {
  std::optional<OpCounter> counter;  // GenerateAll steps the engine on this thread
  if (count_ops) counter.emplace();
  for (size_t start = begin; start < end; start += batch_size) {
    const std::vector<SpecRequest> wave(requests.begin() + start,
                                        requests.begin() + std::min(end, start + batch_size));
    SpecRunStats stats;
    const uint64_t audited_before = planner ? planner->policy().audited_plans() : 0;
    ASSIGN_OR_RETURN(auto results, GenerateAll(engine, wave, nullptr, &stats, planner));
    if (planner) {
      r.audited_plans += static_cast<int64_t>(planner->policy().audited_plans() - audited_before);
    }
    r.budget_nodes += stats.budget_nodes;
    r.engine_steps += stats.steps;
    r.budgeted_sequence_steps += stats.budgeted_sequence_steps;
    r.seconds += stats.seconds;
    r.draft_seconds += stats.draft_seconds;
    r.verify_seconds += stats.verify_seconds;
    r.forward_seconds += stats.forward_seconds;
    r.peak_drafter_state_bytes =
        std::max(r.peak_drafter_state_bytes, stats.peak_drafter_state_bytes);
    for (const auto& x : results) {
      const size_t i = outputs->size();
      r.tokens += static_cast<int64_t>(x.result.tokens.size());
      r.steps += x.stats.steps;
      r.draft_steps += x.stats.draft_steps;
      r.draft_tokens += x.stats.draft_tokens;
      r.draft_depth += x.stats.draft_depth;
      r.accepted_tokens += x.stats.accepted_tokens;
      r.draft_errors += x.stats.draft_errors;
      if (r.first_draft_error.empty()) r.first_draft_error = x.stats.last_draft_error;
      if (baseline && (*baseline)[i] != x.result.tokens) ++r.mismatches;
      outputs->push_back(x.result.tokens);
    }
  }
  if (counter) {
    r.ops += counter->count();
    for (const auto& [name, n] : counter->by_name()) r.ops_by_name[name] += n;
  }
  return OkStatus();
}

// All of `requests` as one run.
StatusOr<RunResult> RunOnce(SpecEngine& engine, const std::vector<SpecRequest>& requests,
                            size_t batch_size, const std::vector<std::vector<int32_t>>* baseline,
                            std::vector<std::vector<int32_t>>* outputs, BudgetPlanner* planner) {
  RunResult r;
  outputs->clear();
  RETURN_IF_ERROR(RunWaves(engine, requests, 0, requests.size(), batch_size, baseline, outputs,
                           planner, /*count_ops=*/false, r));
  return r;
}

Status Run(const BenchFlags& f) {
  if (f.repeats < 1) return InvalidArgumentError("--repeats must be at least 1");
  if (f.max_new_tokens < 1) return InvalidArgumentError("--max-new-tokens must be positive");
  if (f.min_requests < 1) return InvalidArgumentError("--min-requests must be at least 1");
  if (f.interleave_requests < 0) {
    return InvalidArgumentError(
        StrCat("--interleave-requests must be 0 or positive, got ", f.interleave_requests));
  }
  for (int64_t b : f.batch_sizes) {
    if (b < 1) return InvalidArgumentError(StrCat("--batch-sizes: ", b, " is not positive"));
  }
  ASSIGN_OR_RETURN(auto draft_lens, ParseDraftLens(f.draft_lens, f.spec.draft_cap));
  ASSIGN_OR_RETURN(auto specdec_grid, ParseSpecDecGrid(f.specdec_grid));
  if (f.model.model.empty()) return InvalidArgumentError("--model is required");
  ASSIGN_OR_RETURN(auto tokenizer, Tokenizer::FromFile(f.model.model + "/tokenizer.json"));
  std::vector<std::vector<int32_t>> prompts;
  if (!f.prompts.empty()) {
    ASSIGN_OR_RETURN(prompts, PromptFile(*tokenizer, f.prompts));
  } else {
    ASSIGN_OR_RETURN(prompts,
                     HeldOutPrompts(*tokenizer, f.prompt_dir, f.num_prompts, f.prompt_tokens));
  }

  ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> runner, f.model.Load());
  ASSIGN_OR_RETURN(
      SpecEngineOptions engine_options,
      f.spec.EngineOptions(*std::max_element(f.batch_sizes.begin(), f.batch_sizes.end())));
  SpecEngine engine(runner.get(), engine_options);
  RETURN_IF_ERROR(f.spec.AddDrafters(engine, f.model));
  ASSIGN_OR_RETURN(std::vector<std::string> drafters, f.spec.DrafterNames());

  std::vector<Setting> settings = {{"none", 0}};
  if (f.baseline_again) settings.push_back({.drafter = "none", .again = true});
  for (const auto& d : drafters) {
    if (d == "none") continue;
    for (const DraftLen& len : draft_lens) {
      if (specdec_grid.empty()) settings.push_back({d, len.k, len.adaptive, len.audited});
      for (const auto& point : specdec_grid) {
        settings.push_back({d, len.k, len.adaptive, len.audited, point});
      }
    }
  }
  // The speculation settings of setting s (its grid point overrides --verify).
  auto speculation = [&](const Setting& setting) -> StatusOr<SpeculationSettings> {
    ASSIGN_OR_RETURN(SpeculationSettings out,
                     f.spec.Settings(setting.drafter, setting.draft_len, f.temperature));
    if (setting.specdec) {
      out.verify.mode = VerifyMode::kSpecDec;
      out.verify.specdec_beta = setting.specdec->first;
      out.verify.specdec_tau = setting.specdec->second;
    }
    return out;
  };
  bool any_lossy = false;
  for (const Setting& setting : settings) {
    ASSIGN_OR_RETURN(SpeculationSettings spec, speculation(setting));
    any_lossy |= setting.drafter != "none" && spec.verify.lossy();
  }
  // One policy per adaptive setting for the whole run, like a server that keeps serving: it
  // learns across batch sizes and repeats (the cost model is per step shape).
  std::vector<std::unique_ptr<BudgetPlanner>> planners(settings.size());
  for (size_t s = 0; s < settings.size(); ++s) {
    if (settings[s].adaptive) {
      ASSIGN_OR_RETURN(planners[s],
                       f.spec.MakePlanner(engine_options.max_step_tokens, settings[s].audited));
    }
  }
  const bool any_adaptive =
      std::any_of(settings.begin(), settings.end(), [](const Setting& s) { return s.adaptive; });
  ASSIGN_OR_RETURN(std::unique_ptr<StepTrace> trace,
                   f.spec.OpenStepTrace(any_adaptive, "adaptive in --draft-lens"));
  // The trace's label of each adaptive setting's steps: "<setting> b<batch> <phase>".
  auto label_steps = [&](int64_t bs, const std::string& phase) {
    for (size_t s = 0; s < settings.size(); ++s) {
      if (trace && planners[s]) {
        planners[s]->SetTrace(trace.get(), StrCat(settings[s].label(), " b", bs, " ", phase));
      }
    }
  };

  nlohmann::json results = nlohmann::json::array();
  std::printf("%-6s %-18s %10s %10s %9s %9s %6s %6s %6s %7s %7s %8s %s\n", "batch", "setting",
              "tok/s med", "tok/s min", "speedup", "spd min", "a", "kappa", "tree", "draft%",
              "verify%", "drft MB", "mismatch");
  for (int64_t bs : f.batch_sizes) {
    // Warm-up at this batch size, not measured: a full batch of short requests per setting. The
    // first forwards of a process pay one-time costs (thread pools, first touch of the KV cache
    // and the allocator's heap), and a batch shape's first steps more; no setting's measured run
    // should. Adaptive policies learn here too.
    label_steps(bs, "warm-up");
    for (size_t s = 0; s < settings.size(); ++s) {
      std::vector<SpecRequest> warm;
      for (int64_t i = 0; i < bs; ++i) {
        SpecRequest r;
        r.generation.prompt = prompts[static_cast<size_t>(i) % prompts.size()];
        r.generation.max_new_tokens = std::min<int64_t>(8, f.max_new_tokens);
        ASSIGN_OR_RETURN(r.speculation, speculation(settings[s]));
        warm.push_back(std::move(r));
      }
      std::vector<std::vector<int32_t>> ignored;
      RETURN_IF_ERROR(
          RunOnce(engine, warm, static_cast<size_t>(bs), nullptr, &ignored, planners[s].get())
              .status());
    }
    auto requests_for = [&](size_t s) -> StatusOr<std::vector<SpecRequest>> {
      std::vector<SpecRequest> requests;
      for (int64_t i = 0; i < std::max(bs, f.min_requests); ++i) {
        SpecRequest r;
        r.generation.prompt = prompts[i % prompts.size()];
        r.generation.max_new_tokens = f.max_new_tokens;  // no stop tokens: equal work per run
        r.generation.sampling.temperature = static_cast<float>(f.temperature);
        r.generation.sampling.seed = static_cast<uint64_t>(f.seed + i);
        ASSIGN_OR_RETURN(r.speculation, speculation(settings[s]));
        requests.push_back(std::move(r));
      }
      return requests;
    };
    // The reference outputs (no speculation, lossless), from one untimed run: every timed run,
    // the baseline's included, is checked against them, so the baseline need not run first.
    std::vector<std::vector<int32_t>> reference;
    {
      ASSIGN_OR_RETURN(std::vector<SpecRequest> requests, requests_for(0));
      RETURN_IF_ERROR(
          RunOnce(engine, requests, static_cast<size_t>(bs), nullptr, &reference, nullptr)
              .status());
    }
    std::vector<std::vector<RunResult>> runs(settings.size());
    for (int64_t rep = 0; rep < f.repeats; ++rep) {
      // Every setting once, the baseline too, in an order rotated by the repeat, so that no
      // setting always runs first (the baseline used to) or right after another.
      std::vector<size_t> order;
      for (size_t i = 0; i < settings.size(); ++i) order.push_back((i + rep) % settings.size());
      label_steps(bs, StrCat("repeat ", rep + 1));
      std::vector<std::vector<SpecRequest>> requests(settings.size());
      for (size_t s : order) {
        ASSIGN_OR_RETURN(requests[s], requests_for(s));
      }
      const size_t total = reference.size();
      // Turns of whole waves: every setting runs requests [start, start + turn) before the next
      // turn; without interleaving a turn is the whole run.
      const size_t turn = f.interleave_requests > 0
                              ? static_cast<size_t>((f.interleave_requests + bs - 1) / bs * bs)
                              : total;
      std::vector<RunResult> rep_runs(settings.size());
      std::vector<std::vector<std::vector<int32_t>>> outputs(settings.size());
      for (size_t start = 0; start < total; start += turn) {
        const size_t end = std::min(total, start + turn);
        for (size_t s : order) {
          RETURN_IF_ERROR(RunWaves(engine, requests[s], start, end, static_cast<size_t>(bs),
                                   &reference, &outputs[s], planners[s].get(), f.count_ops,
                                   rep_runs[s]));
        }
      }
      for (size_t s : order) {
        RunResult& run = rep_runs[s];
        // Quality is measured outside the timed run, with the engine idle.
        if (any_lossy && (s == 0 || requests[s][0].speculation.verify.lossy())) {
          std::vector<std::vector<int32_t>> request_prompts;
          for (const SpecRequest& r : requests[s]) request_prompts.push_back(r.generation.prompt);
          Quality q;
          q.agreement = CompareOutputs(outputs[s], reference);
          ASSIGN_OR_RETURN(q.log_probs, TargetLogProbs(*runner, request_prompts, outputs[s]));
          run.quality = q;
        }
        runs[s].push_back(std::move(run));
      }
    }
    for (size_t s = 0; s < settings.size(); ++s) {
      std::vector<double> tps, speedups, draft_share, verify_share;
      double a = 0, k = 0, l_d = 0, budget = 0;
      int64_t mismatches = 0, peak_state = 0, draft_errors = 0;
      std::string first_draft_error;
      // Quality over the repeats that measured it: identical share, first divergence (over the
      // repeats where some request diverged), BLEU-4, mean target log-probability.
      std::vector<double> identical, divergence, bleu, log_prob;
      nlohmann::json reps = nlohmann::json::array();
      for (int64_t rep = 0; rep < f.repeats; ++rep) {
        const RunResult& r = runs[s][rep];
        tps.push_back(r.tokens_per_s());
        speedups.push_back(r.tokens_per_s() / runs[0][rep].tokens_per_s());
        draft_share.push_back(r.draft_seconds / r.seconds);
        verify_share.push_back(r.verify_seconds / r.seconds);
        a += r.a() / f.repeats;
        k += r.k() / f.repeats;
        l_d += r.l_d() / f.repeats;
        if (r.budgeted_sequence_steps > 0) {
          budget += static_cast<double>(r.budget_nodes) /
                    static_cast<double>(r.budgeted_sequence_steps) / f.repeats;
        }
        mismatches += r.mismatches;
        draft_errors += r.draft_errors;
        if (first_draft_error.empty()) first_draft_error = r.first_draft_error;
        peak_state = std::max(peak_state, r.peak_drafter_state_bytes);
        nlohmann::json quality = nullptr;
        if (r.quality) {
          const OutputAgreement& agreement = r.quality->agreement;
          identical.push_back(agreement.identical_share());
          if (agreement.mean_first_divergence)
            divergence.push_back(*agreement.mean_first_divergence);
          bleu.push_back(agreement.bleu4);
          log_prob.push_back(r.quality->log_probs.mean());
          quality = {
              {"identical_share", agreement.identical_share()},
              {"mean_first_divergence", agreement.mean_first_divergence
                                            ? nlohmann::json(*agreement.mean_first_divergence)
                                            : nlohmann::json(nullptr)},
              {"bleu4", agreement.bleu4},
              {"mean_target_log_prob", r.quality->log_probs.mean()}};
        }
        reps.push_back({{"quality", quality},
                        {"seconds", r.seconds},
                        {"tokens", r.tokens},
                        {"tokens_per_s", r.tokens_per_s()},
                        {"speedup", speedups.back()},
                        {"steps", r.steps},
                        {"draft_tokens", r.draft_tokens},
                        {"draft_depth", r.draft_depth},
                        {"accepted_tokens", r.accepted_tokens},
                        {"draft_seconds", r.draft_seconds},
                        {"engine_steps", r.engine_steps},
                        {"audited_plans", r.audited_plans},
                        {"verify_seconds", r.verify_seconds},
                        {"forward_seconds", r.forward_seconds},
                        {"mismatches", r.mismatches},
                        {"draft_errors", r.draft_errors},
                        {"peak_drafter_state_bytes", r.peak_drafter_state_bytes}});
      }
      // The drafting audit as this batch size's runs left it (the policy is the whole run's).
      nlohmann::json audit_json = nullptr;
      if (planners[s] && settings[s].audited) {
        const DraftingAudit& audit = planners[s]->policy().audit();
        audit_json = {
            {"verdict", audit.verdict() == DraftingAudit::Verdict::kPays         ? "pays"
                        : audit.verdict() == DraftingAudit::Verdict::kDoesNotPay ? "does not pay"
                                                                                 : "unknown"},
            {"realized_speedup", audit.realized_speedup()},
            {"pairs", audit.pairs()}};
      }
      // kappa = a * l_d / k (SpecFormer): accepted length per draft token spent, scaled by the
      // draft positions l_d (the tree's depth). Chains have l_d = k, so kappa = a.
      const double kappa = k > 0 ? a * l_d / k : 0;
      // theta = kappa / speedup (SpecFormer's kappa-to-TPS conversion ratio; lower is better, 1 =
      // every accepted token turned into speed).
      const double theta = kappa > 0 && Median(speedups) > 0 ? kappa / Median(speedups) : 0;
      // The per-step limit: a tokens per step at the cost of (verify + draft) per step, against
      // one token per step at the no-draft step's cost; and the fraction of it reached.
      std::vector<double> fractions;
      double limit = 0;
      for (int64_t rep = 0; rep < f.repeats; ++rep) {
        const RunResult& r = runs[s][rep];
        const RunResult& base = runs[0][rep];
        if (r.engine_steps == 0 || base.engine_steps == 0 || r.seconds <= 0) continue;
        const double t_none = (base.verify_seconds + base.draft_seconds) / base.engine_steps;
        const double t_spec = (r.verify_seconds + r.draft_seconds) / r.engine_steps;
        const double lim = t_spec > 0 ? r.a() * t_none / t_spec : 0;
        limit += lim / f.repeats;
        if (lim > 0) fractions.push_back(speedups[rep] / lim);
      }
      const double state_mb = peak_state / (1024.0 * 1024.0);
      // --count-ops: LibTorch ops per engine step (each step serves the whole batch), over all
      // repeats; on a GPU each is a kernel launch or host work of a few microseconds.
      nlohmann::json ops_json = nullptr;
      std::string ops_line;
      if (f.count_ops) {
        int64_t ops = 0, steps = 0;
        std::map<std::string, int64_t> by_name;
        for (const RunResult& r : runs[s]) {
          ops += r.ops;
          steps += r.engine_steps;
          for (const auto& [name, n] : r.ops_by_name) by_name[name] += n;
        }
        const double per_step = steps ? static_cast<double>(ops) / steps : 0;
        std::vector<std::pair<int64_t, std::string>> top;
        for (const auto& [name, n] : by_name) top.push_back({n, name});
        std::sort(top.rbegin(), top.rend());
        nlohmann::json names = nlohmann::json::object();
        ops_line = StrCat("ops/step ", static_cast<int64_t>(std::lround(per_step)), ":");
        for (size_t i = 0; i < top.size(); ++i) {
          const double n = steps ? static_cast<double>(top[i].first) / steps : 0;
          names[top[i].second] = n;
          if (i < 8) ops_line += StrCat(" ", top[i].second, " ", std::lround(n * 10) / 10.0);
        }
        ops_json = {{"per_engine_step", per_step}, {"by_name_per_engine_step", names}};
      }
      nlohmann::json results_quality = nullptr;
      std::printf(
          "%-6lld %-18s %10.1f %10.1f %8.2fx %8.2fx %6.2f %6.2f %6.1f %6.1f%% %6.1f%% %8.2f %lld\n",
          static_cast<long long>(bs), settings[s].label().c_str(), Median(tps), Min(tps),
          Median(speedups), Min(speedups), a, kappa, k, 100 * Median(draft_share),
          100 * Median(verify_share), state_mb, static_cast<long long>(mismatches));
      if (!ops_line.empty()) std::printf("%-6s   %s\n", "", ops_line.c_str());
      if (draft_errors > 0) {
        std::printf("%-6s   DRAFTER ERRORS: %lld (first: %s)\n", "",
                    static_cast<long long>(draft_errors), first_draft_error.c_str());
      }
      if (!log_prob.empty()) {
        auto mean = [](const std::vector<double>& v) {
          double total = 0;
          for (double x : v) total += x;
          return v.empty() ? 0.0 : total / static_cast<double>(v.size());
        };
        if (s == 0) {
          std::printf("%-6s   lossless reference: target log-prob/token %.4f\n", "",
                      mean(log_prob));
        } else {
          std::printf(
              "%-6s   LOSSY: identical %.1f%%  first divergence %s  BLEU-4 %.2f  target "
              "log-prob/token %.4f\n",
              "", 100 * mean(identical),
              divergence.empty() ? "none" : StrCat(mean(divergence)).c_str(), mean(bleu),
              mean(log_prob));
        }
        results_quality = {
            {"identical_share", mean(identical)},
            {"mean_first_divergence",
             divergence.empty() ? nlohmann::json(nullptr) : nlohmann::json(mean(divergence))},
            {"bleu4", mean(bleu)},
            {"mean_target_log_prob", mean(log_prob)}};
      }
      results.push_back(
          {{"batch_size", bs},
           {"drafter", settings[s].drafter},
           {"baseline_again", settings[s].again},
           {"specdec_beta", settings[s].specdec ? nlohmann::json(settings[s].specdec->first)
                                                : nlohmann::json(nullptr)},
           {"specdec_tau", settings[s].specdec ? nlohmann::json(settings[s].specdec->second)
                                               : nlohmann::json(nullptr)},
           {"quality", results_quality},
           {"draft_len", settings[s].draft_len},
           {"draft_budget", settings[s].budget()},
           {"mean_draft_budget", settings[s].adaptive ? budget : k},
           {"tokens_per_s_median", Median(tps)},
           {"tokens_per_s_min", Min(tps)},
           {"speedup_median", Median(speedups)},
           {"speedup_min", Min(speedups)},
           {"mean_accepted_len", a},
           {"mean_draft_tokens", k},
           {"mean_draft_depth", l_d},
           {"kappa", kappa},
           {"theta", theta},
           {"speedup_limit", limit},
           {"fraction_of_limit", Median(fractions)},
           {"peak_drafter_state_mb", state_mb},
           {"draft_share_median", Median(draft_share)},
           {"verify_share_median", Median(verify_share)},
           {"output_mismatches", mismatches},
           {"draft_errors", draft_errors},
           {"first_draft_error", first_draft_error.empty() ? nlohmann::json(nullptr)
                                                           : nlohmann::json(first_draft_error)},
           {"ops", ops_json},
           {"audit", audit_json},
           {"repeats", reps}});
    }
    std::fflush(stdout);
  }

  if (!f.json.empty()) {
    nlohmann::json j;
    j["command"] = "bench";
    j["model"] = f.model.model;
    j["drafter_settings"] = f.spec.drafters->Settings();
    j["device"] = runner->device_name();
    j["dtype"] = f.model.dtype;
    j["threads"] = f.model.threads;
    j["cpu_packed_weights"] = f.model.cpu_packed_weights;
    j["prompts"] = f.prompts.empty() ? f.prompt_dir : f.prompts;
    j["num_prompts"] = prompts.size();
    j["prompt_tokens"] = f.prompts.empty() ? f.prompt_tokens : 0;
    j["max_new_tokens"] = f.max_new_tokens;
    j["temperature"] = f.temperature;
    j["verify"] = f.spec.verify.empty() ? "lossless" : f.spec.verify;
    j["specdec_grid"] = f.specdec_grid;
    j["repeats"] = f.repeats;
    j["min_requests"] = f.min_requests;
    j["interleave_requests"] = f.interleave_requests;
    j["results"] = results;
    std::ofstream out(f.json);
    out << j.dump(2) << "\n";
    if (!out) return InternalError(StrCat("cannot write --json ", f.json));
  }
  return OkStatus();
}

}  // namespace

int RunBench(const std::vector<std::string>& args) {
  BenchFlags f;
  FlagSet flags(kCommand);
  f.model.Register(flags);
  f.spec.Register(flags, /*many_drafters=*/true);
  flags.AddString("prompts", &f.prompts,
                  "JSONL prompts ({\"prompt\": text} or {\"prompt_ids\": [...]}); default: "
                  "held-out Python sources");
  flags.AddString("prompt-dir", &f.prompt_dir, "held-out sources to cut prompts from");
  flags.AddInt("num-prompts", &f.num_prompts, "held-out prompts to cut");
  flags.AddInt("prompt-tokens", &f.prompt_tokens, "tokens per held-out prompt");
  flags.AddIntList("batch-sizes", &f.batch_sizes, "concurrent sequences");
  flags.AddString("draft-lens", &f.draft_lens,
                  "draft budgets to compare: tokens per step, and/or adaptive (the policy, up to "
                  "--draft-cap) and adaptive-unaudited (the policy without its drafting audit, "
                  "whatever --draft-audit says)");
  flags.AddString("specdec-grid", &f.specdec_grid,
                  "LOSSY: beta:tau pairs (e.g. 1:1,3:1,5:5); every drafter setting runs once per "
                  "pair with SpecDec's relaxed rule, with the quality figures");
  flags.AddInt("max-new-tokens", &f.max_new_tokens, "tokens generated per request");
  flags.AddInt("repeats", &f.repeats, "runs of every setting (min and median reported)");
  flags.AddInt("min-requests", &f.min_requests,
               "requests per run at least (in waves of batch-size concurrent requests)");
  flags.AddInt("interleave-requests", &f.interleave_requests,
               "settings take turns every this many requests (rounded up to whole waves) within "
               "each repeat, so that the machine's drift falls on all alike; 0 = each run whole");
  flags.AddDouble("temperature", &f.temperature, "0 = greedy");
  flags.AddInt("seed", &f.seed, "sampling seed of request 0 (request i uses seed + i)");
  flags.AddString("json", &f.json, "write every run and the summary here");
  flags.AddBool("baseline-again", &f.baseline_again,
                "also run no speculation as a second setting ('none again', taking its turns like "
                "the others): its speedup over the first is this run's own noise");
  flags.AddBool("count-ops", &f.count_ops,
                "count the LibTorch ops each engine step dispatches (what bounds a small model's "
                "step on a GPU: each is a launch); slows every setting alike");
  return RunCommand(flags, args, [&] { return Run(f); });
}

}  // namespace specula::cli
