// One generation request and its result: what every decoder (plain, speculative, the router's
// plans) takes and returns. Torch-free.
#pragma once

#include <cstdint>
#include <vector>

#include "common/engine/finish_reason.h"
#include "common/sampling/sampler.h"

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

}  // namespace specula
