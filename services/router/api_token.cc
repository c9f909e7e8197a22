#include "services/router/api_token.h"

#include <strings.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace specula::router {
namespace {

std::string_view Trim(std::string_view s) {
  const char* space = " \t\r\n";
  const size_t begin = s.find_first_not_of(space);
  if (begin == std::string_view::npos) return {};
  return s.substr(begin, s.find_last_not_of(space) - begin + 1);
}

}  // namespace

bool ConstantTimeEquals(std::string_view expected, std::string_view given) {
  // Volatile so that the compiler cannot stop at the first difference.
  volatile unsigned char diff = expected.size() != given.size() ? 1 : 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff = diff | (static_cast<unsigned char>(expected[i]) ^ g);
  }
  return diff == 0;
}

StatusOr<std::string> LoadApiToken(const std::string& path) {
  std::string raw;
  std::string source;
  if (!path.empty()) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      return InvalidArgumentError(
          StrCat("--api-token-file: cannot read '", path, "': ", std::strerror(errno)));
    }
    std::ostringstream bytes;
    bytes << in.rdbuf();
    raw = bytes.str();
    source = StrCat("--api-token-file: '", path, "'");
  } else if (const char* env = std::getenv(kApiTokenEnv); env != nullptr) {
    raw = env;
    source = StrCat("$", kApiTokenEnv);
  } else {
    return std::string();
  }
  const std::string token(Trim(raw));
  if (token.empty()) return InvalidArgumentError(StrCat(source, " holds an empty token"));
  for (size_t i = 0; i < token.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(token[i]);
    if (c <= 0x20 || c >= 0x7f) {
      return InvalidArgumentError(StrCat(source, ": the token may hold only visible ASCII (byte ",
                                         i, " is ", static_cast<int>(c), ")"));
    }
  }
  return token;
}

grpc::Status ApiTokenAuth::Check(const grpc::ServerContextBase& context) const {
  if (token_.empty()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  const auto found = metadata.find("authorization");
  if (found == metadata.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "authorization: missing metadata 'authorization: Bearer <token>'");
  }
  const std::string_view value(found->second.data(), found->second.size());
  constexpr std::string_view kScheme = "bearer ";
  if (value.size() < kScheme.size() ||
      strncasecmp(value.data(), kScheme.data(), kScheme.size()) != 0) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "authorization: expected 'Bearer <token>'");
  }
  if (!ConstantTimeEquals(token_, Trim(value.substr(kScheme.size())))) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "authorization: invalid API token");
  }
  return grpc::Status::OK;
}

}  // namespace specula::router
