#include "tests/testing/tiny_model.h"

#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <string>

#include "common/model/checkpoint.h"
#include "common/model/transformer.h"
#include "common/util/mapped_file.h"

namespace specula {

ModelConfig TinyModelConfig() {
  ModelConfig c;
  c.arch = Architecture::kLlama;
  c.model_type = "llama";
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 128;
  return c;
}

std::shared_ptr<CausalLMImpl> MakeTinyModel(const ModelConfig& config, uint64_t seed,
                                            double weight_scale) {
  auto model = std::make_shared<CausalLMImpl>(config);
  model->InitWeights(seed);
  if (weight_scale != 1.0) {
    torch::NoGradGuard no_grad;
    for (auto& p : model->named_parameters()) p.value().mul_(weight_scale);
  }
  return model;
}

std::shared_ptr<CausalLMImpl> MakeVariedTinyModel(const ModelConfig& config, uint64_t seed) {
  auto model = MakeTinyModel(config, seed, /*weight_scale=*/10.0);
  torch::NoGradGuard no_grad;
  torch::manual_seed(seed + 1000);
  for (auto& p : model->named_parameters()) {
    const std::string& name = p.key();
    if (name.find("norm") != std::string::npos) {
      p.value().uniform_(0.5, 1.5);
    } else if (name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
      p.value().normal_(0.0, 0.5);
    }
  }
  model->eval();
  return model;
}

}  // namespace specula
