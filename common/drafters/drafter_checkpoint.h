// Saving and loading a trained drafter's directory: config.json (the drafter's own config, which
// names its kind and target) and model.safetensors (the module's parameters; shared target
// tensors are not parameters, so never saved). Include only from .cc files: pulls in
// <torch/torch.h>.
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <string>

#include "common/model/model_config.h"
#include "common/util/status.h"

namespace specula {

// Writes dir/model.safetensors (metadata kind = `kind`) and dir/config.json = `config_json`.
Status SaveDrafterDir(torch::nn::Module& module, const std::string& dir, const std::string& kind,
                      const std::string& config_json);

// Builds a drafter module from dir/config.json for `target` and loads dir/model.safetensors into
// it. `Config` has FromFile(path) and CheckTarget(target); `Module` is constructed from (config,
// target). NOT_FOUND without config.json; the config's and the weights' errors otherwise. The
// module is on the CPU in float32, in eval mode.
Status LoadDrafterWeights(torch::nn::Module& module, const std::string& dir);
template <typename Module, typename Config>
StatusOr<std::shared_ptr<Module>> LoadDrafterDir(const std::string& dir, const ModelConfig& target,
                                                 const char* drafter) {
  const std::string config_path = (std::filesystem::path(dir) / "config.json").string();
  if (!std::filesystem::exists(config_path)) {
    return NotFoundError(StrCat(drafter, " checkpoint ", dir, ": no config.json"));
  }
  ASSIGN_OR_RETURN(Config config, Config::FromFile(config_path));
  RETURN_IF_ERROR(config.CheckTarget(target).WithContext(dir));
  std::shared_ptr<Module> model;
  try {
    model = std::make_shared<Module>(config, target);
  } catch (const c10::Error& e) {
    return InternalError(StrCat("cannot build ", drafter, ": ", e.what_without_backtrace()));
  }
  RETURN_IF_ERROR(LoadDrafterWeights(*model, dir));
  model->eval();
  return model;
}

}  // namespace specula
