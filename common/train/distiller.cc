#include "common/train/distiller.h"

#include <chrono>
#include <cstdio>
#include <random>

#include "common/engine/plain_decoder.h"
#include "common/train/distill_dataset.h"

namespace specula {

std::vector<int32_t> DistillPrompt(const TokenFile& train, const DistillOptions& o, int64_t index) {
  std::mt19937_64 rng(o.seed * 0x9E3779B97F4A7C15ull +
                      static_cast<uint64_t>(index) * 0xBF58476D1CE4E5B9ull + 1);
  std::uniform_int_distribution<int64_t> length(o.min_prompt_tokens, o.max_prompt_tokens);
  const int64_t n = train.size();
  for (int attempt = 0;; ++attempt) {
    const int64_t want = length(rng);
    int64_t start =
        std::uniform_int_distribution<int64_t>(0, std::max<int64_t>(0, n - want - 1))(rng);
    // Move to the start of a line (bounded scan), so prompts look like what users paste.
    if (!o.line_end_ids.empty()) {
      for (int64_t k = 0; k < 512 && start + want < n; ++k, ++start) {
        if (start == 0 || o.line_end_ids.count(train[start - 1])) break;
      }
    }
    std::vector<int32_t> prompt;
    for (int64_t i = start; i < std::min(n, start + want); ++i) {
      if (train[i] == o.end_of_text_id) break;
      prompt.push_back(train[i]);
    }
    // Accept a prompt cut short by a document end only if it is still long enough.
    if (static_cast<int64_t>(prompt.size()) >= o.min_prompt_tokens || attempt >= 16) {
      if (prompt.empty()) prompt.push_back(train[0]);
      return prompt;
    }
  }
}

StatusOr<int64_t> RunDistillation(ModelRunner& target, const TokenFile& train,
                                  const DistillOptions& o) {
  if (o.num_prompts <= 0 || o.batch_size <= 0 || o.response_tokens <= 0) {
    return InvalidArgumentError("num_prompts, batch_size and response_tokens must be positive");
  }
  if (o.min_prompt_tokens <= 0 || o.max_prompt_tokens < o.min_prompt_tokens) {
    return InvalidArgumentError("need 0 < min_prompt_tokens <= max_prompt_tokens");
  }
  if (train.size() <= o.max_prompt_tokens)
    return InvalidArgumentError("training split is shorter than one prompt");
  size_t present = 0;
  ASSIGN_OR_RETURN(auto writer,
                   DistillWriter::OpenForAppend(
                       o.out_path, static_cast<uint32_t>(target.config().vocab_size), &present));
  if (!o.quiet && present > 0)
    std::fprintf(stderr, "distill: resuming after %zu records\n", present);
  const auto t0 = std::chrono::steady_clock::now();
  int64_t generated = 0;
  for (int64_t first = static_cast<int64_t>(present); first < o.num_prompts;
       first += o.batch_size) {
    const int64_t last = std::min(o.num_prompts, first + o.batch_size);
    std::vector<GenerationRequest> batch;
    for (int64_t i = first; i < last; ++i) {
      GenerationRequest r;
      r.prompt = DistillPrompt(train, o, i);
      r.max_new_tokens = o.response_tokens;
      if (o.end_of_text_id >= 0) r.stop_token_ids = {o.end_of_text_id};
      batch.push_back(std::move(r));
    }
    ASSIGN_OR_RETURN(auto results, DecodeBatch(target, batch));
    for (size_t k = 0; k < batch.size(); ++k) {
      RETURN_IF_ERROR(writer->Append(batch[k].prompt, results[k].tokens));
      generated += static_cast<int64_t>(results[k].tokens.size());
    }
    if (!o.quiet) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double done = static_cast<double>(last - static_cast<int64_t>(present));
      const double eta = s / done * static_cast<double>(o.num_prompts - last);
      std::fprintf(stderr, "distill: %ld/%ld prompts | %ld tokens | %.0f tok/s | ETA %.0fs\n", last,
                   o.num_prompts, generated, generated / s, eta);
    }
  }
  return o.num_prompts;
}

}  // namespace specula
