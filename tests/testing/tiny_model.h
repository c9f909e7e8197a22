// Tiny random models for tests that need a real CausalLM, in memory or as a model directory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/model/model_config.h"
#include "common/model/model_runner.h"
#include "common/util/status.h"

namespace specula {

class CausalLMImpl;

// Llama-style with GQA (4 query heads on 2 kv heads, head_dim 8), hidden 32, intermediate 64,
// 2 layers, vocab 64, context 128, untied embeddings. Tests override what they need.
ModelConfig TinyModelConfig();

// A CausalLM with HF's fresh init (InitWeights(seed)), every parameter then multiplied by
// weight_scale (larger weights give sharper, less tie-prone logits).
std::shared_ptr<CausalLMImpl> MakeTinyModel(const ModelConfig& config, uint64_t seed,
                                            double weight_scale = 1.0);

// MakeTinyModel at weight_scale 10, then random biases (normal 0.5) and norm scales (uniform
// 0.5-1.5), in eval mode: every parameter and every attention edge visibly changes the logits.
std::shared_ptr<CausalLMImpl> MakeVariedTinyModel(const ModelConfig& config, uint64_t seed);

// SaveModelDir (writing a tiny model as an HF directory) lives in common/model/model_runner.h.

}  // namespace specula
