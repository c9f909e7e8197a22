// The prompts of a run, vllm-bench-serve style: a JSONL file, a ShareGPT-format JSON file, random
// token ids, or the held-out Python sources (never trained on; the default). Every request carries
// its own output length where the dataset gives one (JSONL "output_len", ShareGPT's reply length,
// random lengths); 0 means "use --max-new-tokens". Torch-free and gRPC-free.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "common/util/status.h"

namespace specula::loadgen {

// Settings one JSONL line may give its own request; unset ones follow the run's flags. They let
// one run mix greedy and sampled requests, drafters, stop strings, client cancels and short
// deadlines (scripts/soak.sh).
struct RequestOverrides {
  std::optional<std::string> drafter;  // "none", "" (the server's default) or a drafter
  std::optional<int32_t> max_draft_tokens;
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int32_t> top_k;
  std::optional<uint64_t> seed;
  std::optional<bool> ignore_eos;
  std::vector<std::string> stop;
  double cancel_after_s = 0;  // > 0: the client cancels the call this long after sending it
  double timeout_s = 0;       // > 0: this request's deadline instead of --request-timeout-sec
};

struct SampleRequest {
  std::vector<int32_t> prompt_ids;
  int64_t output_len = 0;  // tokens to generate; 0 = the run's --max-new-tokens
  RequestOverrides overrides;
};

// Every non-blank line of a JSONL file: {"prompt": "text"} (encoded with `tokenizer`, special
// tokens added) or {"prompt_ids": [ids]}, optionally with "output_len" (a positive integer) and
// the per-request settings "drafter" (string), "max_draft_tokens" (>= 0), "temperature" (>= 0),
// "top_p" (in (0, 1]), "top_k" (>= 0), "seed" (>= 0), "ignore_eos" (bool), "stop" (array of
// non-empty strings), "cancel_after_ms" and "timeout_ms" (> 0). INVALID_ARGUMENT names the file
// and line of the first malformed one.
StatusOr<std::vector<SampleRequest>> LoadJsonlDataset(const Tokenizer& tokenizer,
                                                      const std::string& path);

// A ShareGPT-format JSON file: an array of {"conversations": [{"from": "human"|"gpt", "value":
// "..."}, ...]}. Each entry's first human (or "user") turn is the prompt; the next gpt (or
// "assistant") turn's token count is the output length. Entries without such a pair are skipped,
// as vLLM skips them; a malformed entry is INVALID_ARGUMENT naming its index.
StatusOr<std::vector<SampleRequest>> LoadShareGptDataset(const Tokenizer& tokenizer,
                                                         const std::string& path);

struct RandomDatasetOptions {
  int64_t num_prompts = 0;
  int64_t input_len = 0;
  int64_t output_len = 0;
  // Lengths uniform in [floor(len * (1 - r)), ceil(len * (1 + r))] (output at least 1), r in
  // [0, 1), as vLLM's random dataset.
  double range_ratio = 0;
  uint64_t seed = 0;
};

// `num_prompts` prompts of uniformly random token ids from the tokenizer's vocabulary, special
// tokens excluded. INVALID_ARGUMENT naming the --random-* flag for bad settings.
StatusOr<std::vector<SampleRequest>> RandomDataset(const Tokenizer& tokenizer,
                                                   const RandomDatasetOptions& options);

// Gives each request without an output length of its own one drawn uniformly from
// RandomLengthBounds(output_len, range_ratio, 1), seeded: the held-out prompts with
// --random-range-ratio, so that a run's requests do not all end on the same step (with one output
// length, requests admitted together finish together and their successors' prompts run in steps
// no stream waits on, unless speculation staggers them). INVALID_ARGUMENT naming
// --random-range-ratio unless it is in [0, 1).
Status SpreadOutputLengths(std::vector<SampleRequest>& requests, int64_t output_len,
                           double range_ratio, uint64_t seed);

// Length bounds [low, high] of the random dataset for `len` and `range_ratio`.
std::pair<int64_t, int64_t> RandomLengthBounds(int64_t len, double range_ratio, int64_t at_least);

}  // namespace specula::loadgen
