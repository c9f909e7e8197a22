// specula generate: continue one prompt with a model directory and stream the text to stdout,
// optionally with speculative decoding (--drafter).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "common/spec/spec_engine.h"
#include "common/tokenizer/stream_decoder.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/mapped_file.h"
#include "tools/cli/commands.h"
#include "tools/cli/model_flags.h"
#include "tools/cli/spec_flags.h"

namespace specula::cli {
namespace {

constexpr char kCommand[] = "generate";

struct GenerateFlags {
  ModelFlags model;
  SpecFlags spec;
  std::string prompt;
  std::string prompt_file;
  std::string prompt_ids;
  int64_t max_new_tokens = 64;
  double temperature = 0.0;
  double top_p = 1.0;
  int64_t top_k = 0;
  int64_t seed = 0;
  bool json = false;
  bool ignore_eos = false;
};

Status Run(const GenerateFlags& f) {
  const int given = !f.prompt.empty() + !f.prompt_file.empty() + !f.prompt_ids.empty();
  if (given != 1)
    return InvalidArgumentError("give exactly one of --prompt, --prompt-file, --prompt-ids");
  if (f.model.model.empty()) return InvalidArgumentError("--model is required");

  // Tokenizer first: a bad model directory is reported before the (slower) weight load.
  std::unique_ptr<Tokenizer> tokenizer;
  const std::string tok_path = (std::filesystem::path(f.model.model) / "tokenizer.json").string();
  if (f.prompt_ids.empty() || std::filesystem::exists(tok_path)) {
    ASSIGN_OR_RETURN(tokenizer, Tokenizer::FromFile(tok_path));
  }
  std::vector<int32_t> prompt;
  if (!f.prompt_ids.empty()) {
    auto ids = ParseIntList(f.prompt_ids);
    if (!ids.ok()) return InvalidArgumentError(StrCat("--prompt-ids: ", ids.status().message()));
    prompt.assign(ids->begin(), ids->end());
  } else {
    std::string text = f.prompt;
    if (!f.prompt_file.empty()) {
      auto file = ReadFileToString(f.prompt_file);
      if (!file.ok()) return file.status().WithContext("--prompt-file");
      text = *file;
    }
    if (text.empty()) return InvalidArgumentError("the prompt is empty");
    prompt = tokenizer->Encode(text, /*add_special_tokens=*/true);
  }

  ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> runner, f.model.Load());
  ASSIGN_OR_RETURN(SpecEngineOptions engine_options,
                   f.spec.EngineOptions(SpecEngineOptions{}.max_batch_size));
  SpecEngine engine(runner.get(), engine_options);
  RETURN_IF_ERROR(f.spec.AddDrafters(engine, f.model));
  ASSIGN_OR_RETURN(std::vector<std::string> drafters, f.spec.DrafterNames());
  if (drafters.size() != 1) return InvalidArgumentError("--drafter: give one drafter");
  if (f.spec.draft_budget != "fixed" && f.spec.draft_budget != "adaptive") {
    return InvalidArgumentError(
        StrCat("--draft-budget must be fixed or adaptive, got '", f.spec.draft_budget, "'"));
  }
  const bool adaptive = f.spec.draft_budget == "adaptive";
  std::unique_ptr<BudgetPlanner> planner;
  if (adaptive) {
    ASSIGN_OR_RETURN(planner, f.spec.MakePlanner(engine_options.max_step_tokens));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<StepTrace> trace,
                   f.spec.OpenStepTrace(adaptive, "--draft-budget adaptive"));
  if (trace) planner->SetTrace(trace.get(), "generate");
  SpecRequest spec_request;
  ASSIGN_OR_RETURN(
      spec_request.speculation,
      f.spec.Settings(drafters[0], adaptive ? f.spec.draft_cap : f.spec.draft_len, f.temperature));
  GenerationRequest& request = spec_request.generation;
  request.prompt = prompt;
  request.max_new_tokens = f.max_new_tokens;
  request.sampling.temperature = static_cast<float>(f.temperature);
  request.sampling.top_p = static_cast<float>(f.top_p);
  request.sampling.top_k = static_cast<int32_t>(f.top_k);
  request.sampling.seed = static_cast<uint64_t>(f.seed);
  if (!f.ignore_eos) request.stop_token_ids = runner->config().eos_token_ids;

  std::unique_ptr<StreamDecoder> stream;
  if (tokenizer && !f.json) stream = std::make_unique<StreamDecoder>(*tokenizer);
  Status stream_error;
  auto on_tokens = [&](size_t, const std::vector<int32_t>& tokens) {
    if (!stream) return;
    for (int32_t token : tokens) {
      auto piece = stream->Push(token);
      if (!piece.ok()) {
        stream_error = piece.status();
        return;
      }
      std::cout << *piece;
    }
    std::cout << std::flush;
  };
  SpecRunStats run;
  auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(auto results,
                   GenerateAll(engine, {spec_request}, on_tokens, &run, planner.get()));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  RETURN_IF_ERROR(stream_error);
  const GenerationResult& result = results[0].result;
  const SpecRequestStats& spec = results[0].stats;
  const bool speculating = spec_request.speculation.enabled();
  const double tokens_per_s = seconds > 0 ? result.tokens.size() / seconds : 0.0;
  if (stream) {
    std::cout << stream->Flush() << std::endl;  // flush before the stats line on stderr
    std::fprintf(stderr, "[%zu prompt tokens, %zu generated, %.1f tokens/s, finish: %s",
                 prompt.size(), result.tokens.size(), tokens_per_s,
                 FinishReasonName(result.finish_reason));
    if (speculating) {
      std::fprintf(
          stderr, ", drafter %s: %lld steps, %lld/%lld drafts accepted, %.2f tokens/step%s",
          drafters[0].c_str(), static_cast<long long>(spec.steps),
          static_cast<long long>(spec.accepted_tokens), static_cast<long long>(spec.draft_tokens),
          spec.mean_accepted_len(), spec.lossy ? ", LOSSY verification" : "");
    }
    std::fprintf(stderr, "]\n");
    return OkStatus();
  }
  nlohmann::json j;
  if (tokenizer) {
    ASSIGN_OR_RETURN(std::string text,
                     tokenizer->Decode(result.tokens, /*skip_special_tokens=*/true));
    j["text"] = text;
  } else {
    j["text"] = nullptr;
  }
  j["token_ids"] = result.tokens;
  j["prompt_tokens"] = prompt.size();
  j["completion_tokens"] = result.tokens.size();
  j["finish_reason"] = FinishReasonName(result.finish_reason);
  j["tokens_per_s"] = tokens_per_s;
  j["seconds"] = seconds;
  j["drafter"] = drafters[0];
  j["draft_len"] = speculating ? spec_request.speculation.max_draft_tokens : 0;
  j["draft_budget"] = f.spec.draft_budget;
  if (adaptive && run.budgeted_sequence_steps > 0) {
    j["mean_draft_budget"] =
        static_cast<double>(run.budget_nodes) / static_cast<double>(run.budgeted_sequence_steps);
  }
  j["verify"] = VerifyModeName(spec_request.speculation.verify.mode);
  j["lossy"] = spec.lossy;
  j["steps"] = spec.steps;
  j["draft_tokens"] = spec.draft_tokens;
  j["accepted_tokens"] = spec.accepted_tokens;
  j["accepted_per_position"] = spec.accepted_per_position;
  j["mean_accepted_len"] = spec.mean_accepted_len();
  j["draft_errors"] = spec.draft_errors;
  if (spec.draft_errors > 0) j["last_draft_error"] = spec.last_draft_error;
  j["draft_s"] = run.draft_seconds;
  j["verify_s"] = run.verify_seconds;
  std::cout << j.dump() << "\n";
  return OkStatus();
}

}  // namespace

int RunGenerate(const std::vector<std::string>& args) {
  GenerateFlags f;
  FlagSet flags(kCommand);
  f.model.Register(flags);
  f.spec.Register(flags, /*many_drafters=*/false);
  flags.AddString("prompt", &f.prompt, "prompt text");
  flags.AddString("prompt-file", &f.prompt_file, "read the prompt text from this file");
  flags.AddString("prompt-ids", &f.prompt_ids, "prompt as comma-separated token ids");
  flags.AddInt("max-new-tokens", &f.max_new_tokens, "tokens to generate at most");
  flags.AddDouble("temperature", &f.temperature, "0 = greedy");
  flags.AddDouble("top-p", &f.top_p, "nucleus sampling mass (1 = off)");
  flags.AddInt("top-k", &f.top_k, "sample among the k most likely tokens (0 = off)");
  flags.AddInt("seed", &f.seed, "sampling seed");
  flags.AddBool("json", &f.json,
                "print {text, token_ids, prompt_tokens, tokens_per_s, ...} as JSON");
  flags.AddBool("ignore-eos", &f.ignore_eos, "do not stop at the model's end-of-sequence tokens");
  return RunCommand(flags, args, [&] { return Run(f); });
}

}  // namespace specula::cli
