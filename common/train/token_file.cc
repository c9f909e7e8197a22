#include "common/train/token_file.h"

#include <string_view>

namespace specula {

StatusOr<TokenFile> TokenFile::Open(const std::string& path) {
  ASSIGN_OR_RETURN(auto file, MappedFile::Open(path));
  if (file->size() % 2 != 0) {
    return DataLossError(
        StrCat(path, ": token file size ", file->size(), " is not a multiple of 2"));
  }
  TokenFile t;
  t.file_ = std::move(file);
  return t;
}

Status WriteTokenFile(const std::string& path, const std::vector<int32_t>& tokens) {
  std::string bytes(tokens.size() * 2, '\0');
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] > 0xffff) {
      return InvalidArgumentError(
          StrCat("token ", tokens[i], " at ", i, " does not fit in uint16"));
    }
    bytes[2 * i] = static_cast<char>(tokens[i] & 0xff);
    bytes[2 * i + 1] = static_cast<char>((tokens[i] >> 8) & 0xff);
  }
  return WriteStringToFile(path, bytes);
}

}  // namespace specula
