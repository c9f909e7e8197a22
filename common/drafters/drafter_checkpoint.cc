#include "common/drafters/drafter_checkpoint.h"

#include <map>

#include "common/model/checkpoint.h"
#include "common/model/model_runner.h"
#include "common/util/mapped_file.h"

namespace specula {

Status SaveDrafterDir(torch::nn::Module& module, const std::string& dir, const std::string& kind,
                      const std::string& config_json) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return InternalError(StrCat("cannot create ", dir, ": ", ec.message()));
  std::map<std::string, at::Tensor> weights;
  for (const auto& p : module.named_parameters()) weights[p.key()] = p.value().detach();
  RETURN_IF_ERROR(SaveSafetensorsFile((fs::path(dir) / "model.safetensors").string(), weights,
                                      {{"format", "pt"}, {"kind", kind}}));
  return WriteStringToFile((fs::path(dir) / "config.json").string(), config_json);
}

Status LoadDrafterWeights(torch::nn::Module& module, const std::string& dir) {
  return LoadWeightsInto(module, dir);
}

}  // namespace specula
