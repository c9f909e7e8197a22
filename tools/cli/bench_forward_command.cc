// specula bench-forward: time of one forward vs the number of tokens in it, for batches of
// sequences with a cached context. This cost curve is what the router's draft budget is sized from:
// the marginal cost of verifying k more tokens per sequence at batch size B. With --drafter, also
// what each drafter's calls cost at the same batch sizes and contexts: Observe of one committed
// token per sequence and Propose of a depth-k draft, next to the target's one-token step.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "common/util/mapped_file.h"
#include "tools/cli/commands.h"
#include "tools/cli/model_flags.h"
#include "tools/cli/op_counter.h"
#include "tools/cli/spec_flags.h"

#include <ATen/ATen.h>

namespace specula::cli {
namespace {

constexpr char kCommand[] = "bench-forward";

struct BenchFlags {
  ModelFlags model;
  SpecFlags spec;
  std::vector<int64_t> draft_depths = {1, 4, 8};
  std::vector<int64_t> batch_sizes = {1, 4, 16, 64};
  std::vector<int64_t> tokens_per_seq = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
  int64_t max_tokens = 1024;
  std::vector<int64_t> contexts = {128};
  int64_t repeats = 5;
  int64_t seed = 0;
  std::string json_out = "bench-forward.json";
  bool list_ops = false;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double ElapsedMs(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

struct Timing {
  double min_ms = 0, median_ms = 0;
  int64_t ops = 0;  // of the first (warm-up) call
};

// Calls `call` repeats + 1 times (the first warms up and counts ops); min and median of the rest,
// each up to the end of the work it queued on the runner's device.
template <typename Call>
StatusOr<Timing> TimeCalls(const ModelRunner& runner, int64_t repeats, bool list_ops,
                           const Call& call) {
  std::vector<double> ms;
  Timing t;
  for (int64_t r = 0; r <= repeats; ++r) {
    std::optional<OpCounter> counter;
    if (r == 0) counter.emplace(list_ops);
    const auto t0 = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(call());
    runner.Synchronize();
    const double elapsed = ElapsedMs(t0);
    if (counter) t.ops = counter->count();
    if (r > 0) ms.push_back(elapsed);
  }
  t.min_ms = *std::min_element(ms.begin(), ms.end());
  t.median_ms = Median(ms);
  return t;
}

// Per drafter, context and batch size: B greedy sequences whose `context` tokens the target
// prefilled (with the hidden states the drafter reads) and the drafter observed; then the time of
// Observe with one more committed token per sequence, and of Propose at each depth (a chain or
// tree of `depth` nodes, as the drafter builds it), against the target's one-token step `step_ms`.
Status RunDrafters(const BenchFlags& f, ModelRunner& runner, std::mt19937& rng,
                   nlohmann::json& rows) {
  ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Drafter>> drafters,
                   f.spec.LoadDrafters(runner.config(), f.model, &runner));
  std::uniform_int_distribution<int32_t> token(
      0, static_cast<int32_t>(runner.config().vocab_size - 1));
  std::printf("\n%-14s %7s %6s %6s %11s %11s %11s %11s %9s %6s\n", "drafter", "context", "batch",
              "depth", "observe_min", "observe_med", "propose_min", "propose_med", "vs_step",
              "ops");
  const int64_t positions = runner.config().max_position_embeddings;
  for (const auto& drafter : drafters) {
    const std::vector<int64_t> layers = drafter->hidden_layers();
    int64_t timed_contexts = 0;
    for (int64_t context : f.contexts) {
      // Each timed Observe commits one more token, so a sequence ends at context + repeats + 1
      // positions before it drafts.
      if (context + f.repeats + 2 >= positions) {
        std::fprintf(stderr,
                     "bench-forward: %s at context %ld skipped: context + --repeats (%ld) + 2 "
                     "must stay below the model's %ld positions\n",
                     drafter->name().c_str(), context, f.repeats, positions);
        continue;
      }
      ++timed_contexts;
      for (int64_t B : f.batch_sizes) {
        std::vector<SeqId> seqs;
        ForwardBatch prefill{.hidden_layers = layers};
        std::vector<std::vector<int32_t>> tokens(B);
        for (int64_t b = 0; b < B; ++b) {
          seqs.push_back(NewSequenceId());
          RETURN_IF_ERROR(runner.AddSequence(seqs.back()));
          RETURN_IF_ERROR(drafter->AddSequence(seqs.back(), SamplingParams{}));
          for (int64_t i = 0; i <= context; ++i) tokens[b].push_back(token(rng));
          prefill.seqs.push_back({.seq = seqs.back(),
                                  .tokens = {tokens[b].begin(), tokens[b].end() - 1},
                                  .logits = LogitsRows::kNone});
        }
        ASSIGN_OR_RETURN(ForwardOutput out, runner.Forward(prefill));
        std::vector<DrafterObservation> observed(B);
        for (int64_t b = 0; b < B; ++b) {
          observed[b] = {.seq = seqs[b], .tokens = tokens[b]};
          for (const at::Tensor& h : out.hidden) {
            observed[b].hidden.push_back(h.narrow(0, b * context, context));
          }
        }
        RETURN_IF_ERROR(drafter->Observe(observed));
        // The target's step these calls are measured against: one token per sequence.
        ForwardBatch step;
        for (SeqId s : seqs) step.seqs.push_back({.seq = s, .tokens = {token(rng)}});
        ASSIGN_OR_RETURN(Timing target_step,
                         TimeCalls(runner, f.repeats, f.list_ops, [&]() -> Status {
                           RETURN_IF_ERROR(runner.Forward(step).status());
                           for (SeqId s : seqs) RETURN_IF_ERROR(runner.Truncate(s, context));
                           return OkStatus();
                         }));
        // One committed token per sequence per call (its hidden state: the last prefill row's).
        ASSIGN_OR_RETURN(Timing observe, TimeCalls(runner, f.repeats, f.list_ops, [&]() -> Status {
                           std::vector<DrafterObservation> next(B);
                           for (int64_t b = 0; b < B; ++b) {
                             next[b] = {.seq = seqs[b], .tokens = {token(rng)}};
                             for (const at::Tensor& h : out.hidden) {
                               next[b].hidden.push_back(h.narrow(0, b * context + context - 1, 1));
                             }
                           }
                           return drafter->Observe(next);
                         }));
        for (int64_t depth : f.draft_depths) {
          std::vector<DraftRequest> requests;
          for (SeqId s : seqs) {
            requests.push_back({.seq = s,
                                .max_nodes = static_cast<int32_t>(depth),
                                .max_depth = static_cast<int32_t>(depth)});
          }
          ASSIGN_OR_RETURN(Timing propose,
                           TimeCalls(runner, f.repeats, f.list_ops, [&]() -> Status {
                             return drafter->Propose(requests).status();
                           }));
          const double vs_step =
              (observe.median_ms + propose.median_ms) / std::max(1e-9, target_step.median_ms);
          std::printf("%-14s %7ld %6ld %6ld %11.3f %11.3f %11.3f %11.3f %8.2fx %6ld\n",
                      drafter->name().c_str(), context, B, depth, observe.min_ms, observe.median_ms,
                      propose.min_ms, propose.median_ms, vs_step, propose.ops);
          std::fflush(stdout);
          rows.push_back({{"drafter", drafter->name()},
                          {"context", context},
                          {"batch", B},
                          {"depth", depth},
                          {"observe_min_ms", observe.min_ms},
                          {"observe_median_ms", observe.median_ms},
                          {"propose_min_ms", propose.min_ms},
                          {"propose_median_ms", propose.median_ms},
                          {"propose_ops", propose.ops},
                          {"target_step_median_ms", target_step.median_ms},
                          {"draft_over_step", vs_step}});
        }
        for (SeqId s : seqs) {
          drafter->ReleaseSequence(s);
          RETURN_IF_ERROR(runner.ReleaseSequence(s));
        }
      }
    }
    if (timed_contexts == 0) {
      return InvalidArgumentError(StrCat("no --contexts value leaves room to time ",
                                         drafter->name(), ": context + --repeats (", f.repeats,
                                         ") + 2 must stay below the model's ", positions,
                                         " positions (lower --repeats or --contexts)"));
    }
  }
  return OkStatus();
}

Status Run(const BenchFlags& f) {
  if (f.repeats <= 0) return InvalidArgumentError("--repeats must be positive");
  ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> runner, f.model.Load());
  const ModelConfig& config = runner->config();
  std::mt19937 rng(static_cast<uint32_t>(f.seed));
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(config.vocab_size - 1));
  auto random_tokens = [&](int64_t n) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = token(rng);
    return t;
  };

  nlohmann::json rows = nlohmann::json::array();
  std::printf("%7s %6s %8s %7s %10s %10s %12s %6s\n", "context", "batch", "tok/seq", "tokens",
              "min_ms", "median_ms", "tokens/s", "ops");
  SeqId next_id = 1;
  for (int64_t context : f.contexts) {
    if (context <= 0) return InvalidArgumentError("--contexts must be positive");
    for (int64_t B : f.batch_sizes) {
      if (B <= 0) return InvalidArgumentError("--batch-sizes must be positive");
      if (context >= config.max_position_embeddings) {
        std::fprintf(stderr, "bench-forward: context %ld skipped: the model has %ld positions\n",
                     context, config.max_position_embeddings);
        break;  // the same for every batch size
      }
      std::vector<SeqId> seqs;
      ForwardBatch prefill;
      for (int64_t b = 0; b < B; ++b) {
        seqs.push_back(next_id++);
        RETURN_IF_ERROR(runner->AddSequence(seqs.back()));
        prefill.seqs.push_back({.seq = seqs.back(), .tokens = random_tokens(context)});
      }
      RETURN_IF_ERROR(runner->Forward(prefill).status());
      for (int64_t n : f.tokens_per_seq) {
        if (B * n > f.max_tokens) continue;  // --max-tokens says so
        if (context + n > config.max_position_embeddings) {
          std::fprintf(stderr,
                       "bench-forward: %ld tokens per sequence at context %ld skipped: more than "
                       "the model's %ld positions\n",
                       n, context, config.max_position_embeddings);
          continue;
        }
        ForwardBatch step;
        for (SeqId s : seqs)
          step.seqs.push_back({.seq = s, .tokens = random_tokens(n), .logits = LogitsRows::kAll});
        std::vector<double> ms;
        int64_t ops = 0;
        for (int64_t r = 0; r <= f.repeats; ++r) {  // r == 0 warms up and counts ops
          std::optional<OpCounter> counter;
          if (r == 0) counter.emplace(f.list_ops);
          auto t0 = std::chrono::steady_clock::now();
          ASSIGN_OR_RETURN(ForwardOutput out, runner->Forward(step));
          at::Tensor host = out.logits.to(at::kCPU);  // includes the device sync a verifier pays
          const double elapsed =
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                  .count();
          if (counter) ops = counter->count();
          for (SeqId s : seqs) RETURN_IF_ERROR(runner->Truncate(s, context));
          if (r > 0) ms.push_back(elapsed);
        }
        const double min_ms = *std::min_element(ms.begin(), ms.end()), med_ms = Median(ms);
        const double tps = B * n / (med_ms / 1000.0);
        std::printf("%7ld %6ld %8ld %7ld %10.3f %10.3f %12.1f %6ld\n", context, B, n, B * n, min_ms,
                    med_ms, tps, ops);
        std::fflush(stdout);
        rows.push_back({{"batch", B},
                        {"tokens_per_seq", n},
                        {"tokens", B * n},
                        {"context", context},
                        {"min_ms", min_ms},
                        {"median_ms", med_ms},
                        {"tokens_per_s", tps},
                        {"ops", ops}});
      }
      for (SeqId s : seqs) RETURN_IF_ERROR(runner->ReleaseSequence(s));
    }
  }
  nlohmann::json drafter_rows = nlohmann::json::array();
  if (f.spec.drafter != "none") RETURN_IF_ERROR(RunDrafters(f, *runner, rng, drafter_rows));
  nlohmann::json report = {{"model", f.model.model},
                           {"device", runner->device_name()},
                           {"dtype", f.model.dtype},
                           {"contexts", f.contexts},
                           {"threads", f.model.threads},
                           {"cpu_packed_weights", f.model.cpu_packed_weights},
                           {"repeats", f.repeats},
                           {"num_parameters", config.num_parameters()},
                           {"results", rows},
                           {"drafters", drafter_rows}};
  RETURN_IF_ERROR(WriteStringToFile(f.json_out, report.dump(2) + "\n"));
  std::fprintf(stderr, "wrote %s\n", f.json_out.c_str());
  return OkStatus();
}

}  // namespace

int RunBenchForward(const std::vector<std::string>& args) {
  BenchFlags f;
  FlagSet flags(kCommand);
  f.model.Register(flags);
  flags.AddIntList("batch-sizes", &f.batch_sizes, "sequences per forward");
  flags.AddIntList("tokens-per-seq", &f.tokens_per_seq, "new tokens per sequence in the forward");
  flags.AddInt("max-tokens", &f.max_tokens,
               "skip settings with more tokens than this in one forward");
  flags.AddIntList("contexts", &f.contexts,
                   "cached positions per sequence before the timed forward (one table each)");
  flags.AddInt("repeats", &f.repeats, "timed repeats per setting (after one warm-up)");
  flags.AddInt("seed", &f.seed, "seed for the random token ids");
  flags.AddString("json", &f.json_out, "where to write the JSON report");
  flags.AddBool("list-ops", &f.list_ops, "print every op of each warm-up forward to stderr");
  f.spec.Register(flags, /*many_drafters=*/true);
  flags.AddIntList("draft-depths", &f.draft_depths,
                   "with --drafter: draft depths (chain / tree nodes) timed per Propose");
  return RunCommand(flags, args, [&] { return Run(f); });
}

}  // namespace specula::cli
