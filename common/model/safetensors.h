// The safetensors file format: 8-byte little-endian header length N, N bytes of JSON header
// ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}), then raw
// data. Reading memory-maps the file; tensors are views into the mapping. Torch-free.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/util/mapped_file.h"
#include "common/util/status.h"

namespace specula {

enum class DType { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

// "F32", "BF16", ... as written in safetensors headers.
std::string_view DTypeName(DType dtype);
StatusOr<DType> ParseDType(std::string_view name);
size_t DTypeSize(DType dtype);

struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // points into the mapping (or the caller's buffer when writing)
  size_t nbytes = 0;

  int64_t numel() const;
};

class SafetensorsFile {
 public:
  // NOT_FOUND for a missing file; DATA_LOSS for a truncated file or a header that does not parse or
  // whose offsets fall outside the file; INVALID_ARGUMENT for an unknown dtype or a shape that does
  // not match the byte size. Every message names the file (and the tensor when one is at fault).
  static StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  const std::vector<TensorView>& tensors() const { return tensors_; }
  const TensorView* Find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return file_->path(); }
  // Keeps the mapping alive for as long as tensors built on its memory live.
  std::shared_ptr<MappedFile> mapping() const { return file_; }

 private:
  std::shared_ptr<MappedFile> file_;
  std::vector<TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Writes tensors (in the given order) with an 8-byte aligned data section.
Status WriteSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                        const std::map<std::string, std::string>& metadata = {});

}  // namespace specula
