// specula bench-policy: the adaptive draft budget's own host time per step. The policy plans every
// step on the engine thread (BudgetPlanner::Plan) and learns from every step (OnStep); on a GPU
// whose step is a few milliseconds at batch 64 that time is part of every step, drafting or not.
// This drives a BudgetPlanner with a synthetic machine (a target whose step cost is flat up to a
// knee and linear past it, one drafter per scenario, acceptance drawn per position) for a batch
// of requests that never end, and times Plan and OnStep alone: no model is loaded.
//
// Scenarios: "idle" (a drafter that never pays: the policy drafts only its probes and trials, the
// floor's case) and "pays" (a cheap drafter with high acceptance: the policy allocates nodes every
// step).
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "common/spec/budget_planner.h"
#include "common/util/flags.h"
#include "tools/cli/commands.h"
#include "tools/cli/model_flags.h"  // RunCommand

namespace specula::cli {
namespace {

constexpr char kCommand[] = "bench-policy";

struct BenchFlags {
  std::vector<int64_t> batch_sizes = {1, 4, 16, 64, 256};
  std::string scenarios = "idle,pays";
  int64_t warmup_steps = 500;
  int64_t steps = 2000;
  int64_t draft_cap = 16;
  int64_t context = 512;
  int64_t seed = 1;
  std::string json_out = "bench-policy.json";
};

// The synthetic machine of one scenario, in seconds.
struct Machine {
  double step_seconds;  // the target's step up to knee_tokens rows
  double knee_tokens;   // rows from which each more row costs row_seconds
  double row_seconds;   // per row past the knee
  double call_seconds;  // one drafter call
  double seq_seconds;   // per sequence in the call
  double node_seconds;  // per drafted node
  double acceptance;    // P(a draft position is accepted | the one before was)
  std::string drafter;
};

StatusOr<Machine> MachineFor(const std::string& scenario) {
  // Both at GPU scale: a 3 ms step flat up to 256 rows (a small model on an H200 at batch 64).
  if (scenario == "idle") {
    return Machine{3e-3, 256, 2e-5, 2e-3, 1e-4, 2e-5, 0.2, "slow"};
  }
  if (scenario == "pays") {
    return Machine{3e-3, 256, 2e-5, 2e-4, 5e-6, 1e-6, 0.8, "fast"};
  }
  return InvalidArgumentError("--scenarios: unknown scenario '" + scenario +
                              "' (expected idle or pays)");
}

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}

struct Timings {
  std::vector<double> plan_us, observe_us;
  int64_t drafted = 0, sequence_steps = 0;
  // The synthetic machine's tokens and seconds over the timed steps (what the plans bought).
  double tokens = 0, seconds = 0;
  // The step cost fit at the end against the machine: (rows, predicted, true seconds) at 1x, 2x
  // and 4x the batch's rows.
  std::vector<std::array<double, 3>> fit;
};

// One scenario at one batch size: warm-up, then `steps` timed steps.
Timings RunScenario(const BenchFlags& f, const Machine& m, int64_t batch) {
  // The policy's own plans are what is timed: the drafting audit's no-draft epochs (which plan
  // nothing) would fall on some timed steps and not on others.
  DraftBudgetOptions options;
  options.audit.enabled = false;
  BudgetPlanner planner(options, /*max_step_tokens=*/0);
  std::mt19937_64 rng(static_cast<uint64_t>(f.seed));
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  struct Request {
    int64_t context = 0;
    int64_t unobserved = 0;
  };
  std::vector<Request> requests(static_cast<size_t>(batch));
  SpecRequest request;
  request.generation.prompt.assign(static_cast<size_t>(f.context), 1);
  request.generation.max_new_tokens = int64_t{1} << 40;  // never ends
  request.speculation.drafter = m.drafter;
  request.speculation.max_draft_tokens = static_cast<int32_t>(f.draft_cap);
  // Every request is admitted and prefilled in the first step (a report with its first token).
  StepReport first;
  for (int64_t id = 0; id < batch; ++id) {
    planner.Admit(id, request);
    requests[static_cast<size_t>(id)] = {.context = f.context + 1, .unobserved = f.context + 1};
    first.updates.push_back({.id = id,
                             .new_tokens = {1},
                             .context_tokens = f.context + 1,
                             .unobserved_tokens = f.context + 1,
                             .max_draft_nodes = static_cast<int32_t>(f.draft_cap)});
  }
  first.prefill_tokens = batch * f.context;
  first.verify_seconds = m.step_seconds * static_cast<double>(batch);
  planner.OnStep(first, first.verify_seconds);

  Timings t;
  using Clock = std::chrono::steady_clock;
  const auto micros = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::micro>(b - a).count();
  };
  for (int64_t step = 0; step < f.warmup_steps + f.steps; ++step) {
    const auto t0 = Clock::now();
    const std::vector<StepPlan::DraftBudget> budgets = planner.Plan();
    const auto t1 = Clock::now();
    // The step the plan asked for, on the synthetic machine.
    StepReport report;
    DrafterCall call{.drafter = m.drafter};
    int64_t rows = 0;
    for (const StepPlan::DraftBudget& b : budgets) {
      Request& r = requests[static_cast<size_t>(b.id)];
      const int32_t nodes = b.max_draft_tokens;
      int32_t accepted = 0;
      while (accepted < nodes && uniform(rng) < m.acceptance) ++accepted;
      if (nodes > 0) {
        ++call.sequences;
        call.nodes += nodes;
        call.max_depth = std::max(call.max_depth, nodes);
        call.observed_tokens += r.unobserved;
        r.unobserved = 0;
        ++t.drafted;
      }
      ++t.sequence_steps;
      rows += 1 + nodes;
      const int64_t produced = accepted + 1;
      if (step >= f.warmup_steps) t.tokens += static_cast<double>(produced);
      r.context += produced;
      r.unobserved += produced;
      RequestUpdate u{.id = b.id,
                      .new_tokens = std::vector<int32_t>(static_cast<size_t>(produced), 1),
                      .draft_nodes = nodes,
                      .draft_depth = nodes,
                      .draft_accepted = accepted,
                      .context_tokens = r.context,
                      .unobserved_tokens = r.unobserved,
                      .max_draft_nodes = static_cast<int32_t>(f.draft_cap)};
      report.attention += static_cast<double>(1 + nodes) * static_cast<double>(r.context);
      report.updates.push_back(std::move(u));
    }
    report.batch_size = static_cast<int32_t>(batch);
    report.verify_tokens = rows;
    report.verify_seconds =
        m.step_seconds + m.row_seconds * std::max(0.0, static_cast<double>(rows) - m.knee_tokens);
    report.forward_seconds = report.verify_seconds;
    if (call.sequences > 0) {
      call.seconds = m.call_seconds + m.seq_seconds * call.sequences +
                     m.node_seconds * static_cast<double>(call.nodes);
      report.draft_seconds = call.seconds;
      report.drafter_calls.push_back(call);
    }
    if (step >= f.warmup_steps) t.seconds += report.verify_seconds + report.draft_seconds;
    const auto t2 = Clock::now();
    planner.OnStep(report, report.verify_seconds + report.draft_seconds + 2e-5);
    const auto t3 = Clock::now();
    if (step >= f.warmup_steps) {
      t.plan_us.push_back(micros(t0, t1));
      t.observe_us.push_back(micros(t2, t3));
    } else {
      t.drafted = 0;
      t.sequence_steps = 0;
    }
  }
  for (int64_t times : {1, 2, 4}) {
    const int64_t rows = batch * times;
    const double attention = static_cast<double>(rows) * static_cast<double>(f.context + 1000);
    const double predicted = planner.policy().target_cost().Predict(
        {.tokens = rows, .attention = attention, .chunk_tokens = 0});
    const double truth =
        m.step_seconds + m.row_seconds * std::max(0.0, static_cast<double>(rows) - m.knee_tokens);
    t.fit.push_back({static_cast<double>(rows), predicted, truth});
  }
  return t;
}

Status Run(const BenchFlags& f) {
  if (f.steps < 1) return InvalidArgumentError("--steps must be at least 1");
  if (f.warmup_steps < 0) return InvalidArgumentError("--warmup-steps must be at least 0");
  if (f.draft_cap < 1 || f.draft_cap > kMaxDraftTokens) {
    return InvalidArgumentError("--draft-cap must be in [1, 256]");
  }
  if (f.context < 1) return InvalidArgumentError("--context must be at least 1");
  for (int64_t b : f.batch_sizes) {
    if (b < 1 || b > 4096) return InvalidArgumentError("--batch-sizes must be in [1, 4096]");
  }
  nlohmann::json results = nlohmann::json::array();
  std::printf("%-8s %6s %10s %10s %10s %10s %10s %10s %8s %9s  %s\n", "scenario", "batch",
              "plan min", "plan med", "plan p99", "obs min", "obs med", "obs p99", "drafted",
              "sim tok/s", "fit / true ms at 1x 2x 4x rows");
  std::istringstream list(f.scenarios);
  for (std::string scenario; std::getline(list, scenario, ',');) {
    ASSIGN_OR_RETURN(Machine m, MachineFor(scenario));
    for (int64_t batch : f.batch_sizes) {
      const Timings t = RunScenario(f, m, batch);
      const double drafted = t.sequence_steps > 0 ? static_cast<double>(t.drafted) /
                                                        static_cast<double>(t.sequence_steps)
                                                  : 0.0;
      const double plan_min = Percentile(t.plan_us, 0), plan_med = Percentile(t.plan_us, 0.5),
                   plan_p99 = Percentile(t.plan_us, 0.99);
      const double obs_min = Percentile(t.observe_us, 0), obs_med = Percentile(t.observe_us, 0.5),
                   obs_p99 = Percentile(t.observe_us, 0.99);
      std::printf("%-8s %6lld %8.1fus %8.1fus %8.1fus %8.1fus %8.1fus %8.1fus %7.1f%% %9.0f ",
                  scenario.c_str(), static_cast<long long>(batch), plan_min, plan_med, plan_p99,
                  obs_min, obs_med, obs_p99, 100 * drafted, t.tokens / t.seconds);
      nlohmann::json fit = nlohmann::json::array();
      for (const auto& [rows, predicted, truth] : t.fit) {
        std::printf(" %.2f/%.2f", 1e3 * predicted, 1e3 * truth);
        fit.push_back({{"rows", rows}, {"predicted_s", predicted}, {"true_s", truth}});
      }
      std::printf("\n");
      results.push_back({{"scenario", scenario},
                         {"batch_size", batch},
                         {"plan_us", {{"min", plan_min}, {"median", plan_med}, {"p99", plan_p99}}},
                         {"observe_us", {{"min", obs_min}, {"median", obs_med}, {"p99", obs_p99}}},
                         {"drafted_sequence_steps", drafted},
                         {"synthetic_tokens_per_s", t.tokens / t.seconds},
                         {"step_cost_fit", fit}});
    }
  }
  nlohmann::json j = {
      {"command", kCommand},      {"steps", f.steps},     {"warmup_steps", f.warmup_steps},
      {"draft_cap", f.draft_cap}, {"context", f.context}, {"results", results}};
  std::ofstream out(f.json_out);
  if (!out) return InvalidArgumentError("--json: cannot write " + f.json_out);
  out << j.dump(2) << "\n";
  std::printf("wrote %s\n", f.json_out.c_str());
  return OkStatus();
}

}  // namespace

int RunBenchPolicy(const std::vector<std::string>& args) {
  BenchFlags f;
  FlagSet flags(kCommand);
  flags.AddIntList("batch-sizes", &f.batch_sizes, "decoding requests per step");
  flags.AddString(
      "scenarios", &f.scenarios,
      "comma-separated: idle (a drafter that never pays: probes only) and/or pays (a cheap drafter "
      "with high acceptance: nodes every step)");
  flags.AddInt("warmup-steps", &f.warmup_steps, "untimed steps first (the models learn)");
  flags.AddInt("steps", &f.steps, "timed steps per scenario and batch size");
  flags.AddInt("draft-cap", &f.draft_cap, "most draft nodes per request and step");
  flags.AddInt("context", &f.context, "prompt tokens per request");
  flags.AddInt("seed", &f.seed, "seed of the acceptance draws");
  flags.AddString("json", &f.json_out, "where to write the JSON report");
  return RunCommand(flags, args, [&] { return Run(f); });
}

}  // namespace specula::cli
