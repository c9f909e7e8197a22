// Hugging Face checkpoints: model.safetensors or sharded model-0000x-of-0000n.safetensors with
// model.safetensors.index.json. Tensors are zero-copy views of the memory-mapped files.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>

#include "common/util/status.h"

namespace specula {

// name -> tensor (CPU, the file's dtype). NOT_FOUND if the directory has no safetensors; errors
// from the files name the file and tensor.
StatusOr<std::map<std::string, at::Tensor>> LoadSafetensorsDir(const std::string& dir);

// One file's tensors.
StatusOr<std::map<std::string, at::Tensor>> LoadSafetensorsFile(const std::string& path);

// Writes CPU-contiguous copies of the tensors (sorted by name) to one safetensors file.
Status SaveSafetensorsFile(const std::string& path,
                           const std::map<std::string, at::Tensor>& tensors,
                           const std::map<std::string, std::string>& metadata = {});

}  // namespace specula
