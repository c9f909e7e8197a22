// Batched autoregressive decoding without speculation: the reference every speculative path must
// reproduce token for token (greedy) or in distribution (sampling).
//
// Loop: one prefill forward for all prompts, then one forward per step over the sequences still
// running; each step samples one token per sequence and retires those that hit a stop token or
// max_new_tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/engine/generation_request.h"
#include "common/model/model_runner.h"
#include "common/sampling/sampler.h"
#include "common/util/status.h"

namespace specula {

struct DecodeStats {
  double prefill_seconds = 0;
  double decode_seconds = 0;
  int64_t forward_steps = 0;  // decode forwards after prefill
  int64_t generated_tokens = 0;
};

// Called for each new token as soon as it is sampled: (request index, token id).
using TokenCallback = std::function<void(size_t, int32_t)>;

// Validates each request (INVALID_ARGUMENT naming request i and the field; OUT_OF_RANGE when the
// prompt plus max_new_tokens exceeds the context length) before touching the model. Sequences are
// released before returning, on success and on error.
StatusOr<std::vector<GenerationResult>> DecodeBatch(ModelRunner& runner,
                                                    const std::vector<GenerationRequest>& requests,
                                                    const TokenCallback& on_token = nullptr,
                                                    DecodeStats* stats = nullptr);

// Checks one request against the model (shared with other decoders).
Status ValidateRequest(const ModelConfig& config, const GenerationRequest& request);

}  // namespace specula
