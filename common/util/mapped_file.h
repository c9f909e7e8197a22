// Read-only memory mapping of a whole file (copy-on-write private mapping, so tensors built on top
// of it may be written without touching the file).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/util/status.h"

namespace specula {

class MappedFile {
 public:
  // NOT_FOUND if the file does not exist, DATA_LOSS / INTERNAL if it cannot be mapped.
  static StatusOr<std::shared_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  uint8_t* mutable_data() { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  uint8_t* data_;
  size_t size_;
};

// Whole file as a string. NOT_FOUND if missing.
StatusOr<std::string> ReadFileToString(const std::string& path);
// Writes atomically (temp file + rename).
Status WriteStringToFile(const std::string& path, std::string_view contents);

}  // namespace specula
