// A drafter's first calls do once what later calls do not: int8, bfloat16 or packed copies of its
// weights made at their first use, scratch buffers sized, LibTorch's and the kernels' thread pools
// started, a device's kernels launched for the first time. Measured in three processes on the
// CPU, SpecFormer's first call (a catch-up of 65 tokens and a 1-node draft) took 24 ms where the
// next catch-ups of that size took 5-6 ms: the first request that drafted paid it, and the draft
// budget fitted it as the drafter's cost. WarmUpDrafter pays it at load, on a throwaway sequence.
#pragma once

#include <cstdint>

#include "common/model/model_config.h"
#include "common/model/model_runner.h"
#include "common/spec/drafter.h"
#include "common/util/status.h"

namespace specula {

// Drives `drafter` as the engine does on one throwaway sequence: Add, Observe a prompt of
// `prompt_tokens` tokens (token ids 1, 2, ... of the target's vocabulary; zero hidden states of
// its width, in the dtype and on the device of `target_options`, for each of the drafter's
// hidden_layers()), Propose a tree of up to 8 nodes, Observe two more tokens, Propose again,
// Release. The drafter holds nothing of it after. The first error, with "warm-up" as context (a
// drafter that cannot draft fails at load, not at its first request).
Status WarmUpDrafter(Drafter& drafter, const ModelConfig& target,
                     const ModelRunnerOptions& target_options, int64_t prompt_tokens = 64);

}  // namespace specula
