#include "common/model/checkpoint.h"

#include <torch/torch.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "common/model/safetensors.h"

namespace specula {
namespace {

namespace fs = std::filesystem;

torch::ScalarType ToTorch(DType d) {
  switch (d) {
    case DType::kF64:
      return torch::kDouble;
    case DType::kF32:
      return torch::kFloat;
    case DType::kF16:
      return torch::kHalf;
    case DType::kBF16:
      return torch::kBFloat16;
    case DType::kI64:
      return torch::kLong;
    case DType::kI32:
      return torch::kInt;
    case DType::kI16:
      return torch::kShort;
    case DType::kI8:
      return torch::kChar;
    case DType::kU8:
      return torch::kByte;
    case DType::kBool:
      return torch::kBool;
  }
  return torch::kFloat;
}

StatusOr<DType> FromTorch(torch::ScalarType t) {
  switch (t) {
    case torch::kDouble:
      return DType::kF64;
    case torch::kFloat:
      return DType::kF32;
    case torch::kHalf:
      return DType::kF16;
    case torch::kBFloat16:
      return DType::kBF16;
    case torch::kLong:
      return DType::kI64;
    case torch::kInt:
      return DType::kI32;
    case torch::kShort:
      return DType::kI16;
    case torch::kChar:
      return DType::kI8;
    case torch::kByte:
      return DType::kU8;
    case torch::kBool:
      return DType::kBool;
    default:
      return InvalidArgumentError("tensor dtype has no safetensors equivalent");
  }
}

}  // namespace

StatusOr<std::map<std::string, at::Tensor>> LoadSafetensorsFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path));
  std::shared_ptr<MappedFile> mapping = file->mapping();
  std::map<std::string, at::Tensor> out;
  for (const TensorView& t : file->tensors()) {
    // The deleter holds the mapping: tensors stay valid after the file object is gone.
    auto keep = mapping;
    out[t.name] = torch::from_blob(
        const_cast<uint8_t*>(t.data), t.shape, [keep](void*) mutable { keep.reset(); },
        torch::TensorOptions().dtype(ToTorch(t.dtype)));
  }
  return out;
}

StatusOr<std::map<std::string, at::Tensor>> LoadSafetensorsDir(const std::string& dir) {
  const fs::path root(dir);
  if (!fs::is_directory(root)) return NotFoundError(StrCat("model directory not found: ", dir));
  std::vector<std::string> files;
  const fs::path index = root / "model.safetensors.index.json";
  if (fs::exists(index)) {
    ASSIGN_OR_RETURN(std::string text, ReadFileToString(index.string()));
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
      return InvalidArgumentError(StrCat(index.string(), ": missing or malformed 'weight_map'"));
    }
    std::set<std::string> shard_names;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string()) {
        return InvalidArgumentError(
            StrCat(index.string(), ": weight_map['", it.key(), "'] must be a file name"));
      }
      shard_names.insert(it.value().get<std::string>());
    }
    for (const auto& s : shard_names) files.push_back((root / s).string());
  } else if (fs::exists(root / "model.safetensors")) {
    files.push_back((root / "model.safetensors").string());
  } else {
    return NotFoundError(StrCat(dir, ": no model.safetensors or model.safetensors.index.json"));
  }
  std::map<std::string, at::Tensor> all;
  for (const auto& f : files) {
    ASSIGN_OR_RETURN(auto tensors, LoadSafetensorsFile(f));
    for (auto& [name, t] : tensors) {
      if (all.count(name))
        return InvalidArgumentError(StrCat(f, ": tensor '", name, "' appears in two shards"));
      all[name] = t;
    }
  }
  return all;
}

Status SaveSafetensorsFile(const std::string& path,
                           const std::map<std::string, at::Tensor>& tensors,
                           const std::map<std::string, std::string>& metadata) {
  std::vector<at::Tensor> keep;
  std::vector<TensorView> views;
  for (const auto& [name, tensor] : tensors) {
    auto t = tensor.detach().to(torch::kCPU).contiguous();
    keep.push_back(t);
    ASSIGN_OR_RETURN(DType dtype, FromTorch(t.scalar_type()));
    TensorView v;
    v.name = name;
    v.dtype = dtype;
    v.shape = t.sizes().vec();
    v.data = static_cast<const uint8_t*>(t.data_ptr());
    v.nbytes = t.numel() * t.element_size();
    views.push_back(std::move(v));
  }
  return WriteSafetensors(path, views, metadata);
}

}  // namespace specula
