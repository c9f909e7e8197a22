// One generation request and its result: what every decoder (plain, speculative, the router's
// plans) takes and returns. Torch-free.
#pragma once

#include <cstdint>
#include <vector>

#include "common/engine/finish_reason.h"
#include "common/sampling/sampler.h"
#include "common/util/status.h"

namespace specula {

struct GenerationRequest {
  std::vector<int32_t> prompt;  // token ids
  SamplingParams sampling;
  int64_t max_new_tokens = 64;
  std::vector<int32_t> stop_token_ids;  // e.g. the model's eos ids
};

struct GenerationResult {
  std::vector<int32_t> tokens;  // generated tokens (including a final stop token)
  FinishReason finish_reason = FinishReason::kLength;  // kStop or kLength
};

// Checks a request against a model of `vocab_size` tokens and `context_length` positions:
// INVALID_ARGUMENT naming the field (an empty prompt, a token outside the vocabulary,
// max_new_tokens not positive, sampling parameters), OUT_OF_RANGE when the prompt plus
// max_new_tokens exceeds the context. Every decoder and the router validate with it.
Status ValidateGenerationRequest(const GenerationRequest& request, int64_t vocab_size,
                                 int64_t context_length);

}  // namespace specula
