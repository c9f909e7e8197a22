// specula generate: continue one prompt with a model directory and stream the text to stdout.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "common/engine/plain_decoder.h"
#include "common/tokenizer/stream_decoder.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/mapped_file.h"
#include "tools/cli/commands.h"
#include "tools/cli/model_flags.h"

namespace specula::cli {
namespace {

constexpr char kCommand[] = "generate";

struct GenerateFlags {
  ModelFlags model;
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
  GenerationRequest request;
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
  auto on_token = [&](size_t, int32_t token) {
    if (!stream) return;
    auto piece = stream->Push(token);
    if (!piece.ok()) {
      stream_error = piece.status();
      return;
    }
    std::cout << *piece << std::flush;
  };
  DecodeStats stats;
  auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(auto results, DecodeBatch(*runner, {request}, on_token, &stats));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  RETURN_IF_ERROR(stream_error);
  const GenerationResult& result = results[0];
  const double tokens_per_s = seconds > 0 ? result.tokens.size() / seconds : 0.0;
  if (stream) {
    std::cout << stream->Flush() << std::endl;  // flush before the stats line on stderr
    std::fprintf(stderr, "[%zu prompt tokens, %zu generated, %.1f tokens/s, finish: %s]\n",
                 prompt.size(), result.tokens.size(), tokens_per_s, result.finish_reason.c_str());
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
  j["finish_reason"] = result.finish_reason;
  j["tokens_per_s"] = tokens_per_s;
  j["prefill_s"] = stats.prefill_seconds;
  j["decode_s"] = stats.decode_seconds;
  std::cout << j.dump() << "\n";
  return OkStatus();
}

}  // namespace

int RunGenerate(const std::vector<std::string>& args) {
  GenerateFlags f;
  FlagSet flags(kCommand);
  f.model.Register(flags);
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
