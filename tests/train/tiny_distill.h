// The data the drafter trainer tests share: a tiny random target saved as a model directory and a
// self-distillation dataset of its greedy continuations.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/util/status.h"

namespace specula {

// n tokens below TinyModelConfig().vocab_size, from `seed`.
std::vector<int32_t> RandomTokens(size_t n, uint32_t seed);

// Writes MakeTinyModel(TinyModelConfig(), 3, weight_scale 4) to target_dir and, at distill_path,
// the target's greedy continuation (max_new_tokens) of each prompt RandomTokens(4 + i % 7,
// 100 + i), i < records. Returns the prompts.
StatusOr<std::vector<std::vector<int32_t>>> WriteTinyTargetAndDistill(
    const std::string& target_dir, const std::string& distill_path, int records,
    int max_new_tokens);

}  // namespace specula
