#include "common/train/adamw.h"

namespace specula {

std::unique_ptr<torch::optim::AdamW> MakeAdamW(torch::nn::Module& module, const AdamWSettings& s) {
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& p : module.named_parameters())
    (p.value().dim() >= 2 ? decay : no_decay).push_back(p.value());
  auto opts = torch::optim::AdamWOptions(s.lr).betas({s.beta1, s.beta2}).eps(s.eps);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                                 torch::optim::AdamWOptions(opts).weight_decay(s.weight_decay)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(
                                    torch::optim::AdamWOptions(opts).weight_decay(0.0)));
  return std::make_unique<torch::optim::AdamW>(groups, opts);
}

}  // namespace specula
