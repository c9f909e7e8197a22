// Token streams on disk: a flat little-endian uint16 (vocab <= 65536) array of token ids, documents
// separated by the end-of-text token. Small, mmap-able, and trivially read from Python (numpy).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/util/mapped_file.h"
#include "common/util/status.h"

namespace specula {

class TokenFile {
 public:
  // DATA_LOSS if the size is not a multiple of 2 bytes.
  static StatusOr<TokenFile> Open(const std::string& path);
  int64_t size() const { return static_cast<int64_t>(file_->size() / 2); }
  int32_t operator[](int64_t i) const { return data()[i]; }
  const uint16_t* data() const { return reinterpret_cast<const uint16_t*>(file_->data()); }

 private:
  std::shared_ptr<MappedFile> file_;
};

// INVALID_ARGUMENT if any id does not fit in uint16.
Status WriteTokenFile(const std::string& path, const std::vector<int32_t>& tokens);

}  // namespace specula
