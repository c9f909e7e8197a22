// A small SpecDec drafter module with random, scaled-up weights for the tests: varied, sharp slot
// distributions (the 0.02 init gives near-uniform ones). Include only from test .cc files.
#pragma once

#include <torch/torch.h>

#include <memory>

#include "common/drafters/specdec/specdec_config.h"
#include "common/drafters/specdec/specdec_model.h"

namespace specula {

// d 32, 4 / 2 heads of 8, SwiGLU 48, `encoder_layers` + `decoder_layers`, k slots.
inline SpecDecConfig TinySpecDecConfig(const ModelConfig& target, int64_t encoder_layers,
                                       int64_t decoder_layers, int64_t slots) {
  SpecDecConfig c = SpecDecConfig::ForTarget(target);
  c.hidden_size = 32;
  c.encoder_layers = encoder_layers;
  c.decoder_layers = decoder_layers;
  c.num_slots = slots;
  c.geometry = {.num_attention_heads = 4,
                .num_key_value_heads = 2,
                .head_dim = 8,
                .intermediate_size = 48,
                .rms_norm_eps = 1e-5};
  return c;
}

// InitWeights(seed), then every weight but the norms times 10.
inline std::shared_ptr<SpecDecImpl> RandomSpecDecModule(const SpecDecConfig& config,
                                                        const ModelConfig& target, uint64_t seed) {
  auto m = std::make_shared<SpecDecImpl>(config, target);
  m->InitWeights(seed);
  torch::NoGradGuard no_grad;
  for (auto& p : m->named_parameters()) {
    if (p.key().find("norm") == std::string::npos) p.value().mul_(10.0);
  }
  return m;
}

}  // namespace specula
