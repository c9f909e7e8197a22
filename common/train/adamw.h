// The optimizer every trainer uses: AdamW with weight decay on matrices only (norm weights and
// biases, the 1-D parameters, are not decayed). Train-internal header (includes LibTorch).
#pragma once

#include <torch/torch.h>

#include <memory>

namespace specula {

struct AdamWSettings {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

std::unique_ptr<torch::optim::AdamW> MakeAdamW(torch::nn::Module& module, const AdamWSettings& s);

}  // namespace specula
